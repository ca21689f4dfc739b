-- Loaded by Neovim at start-up; set-up stays explicit: require("codespec").setup({...})
if vim.g.loaded_codespec then
  return
end
vim.g.loaded_codespec = true
vim.api.nvim_create_user_command("CodespecStatus", function()
  print(require("codespec").status())
end, { desc = "codespec: the language server's status" })
