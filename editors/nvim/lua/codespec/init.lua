-- codespec for Neovim: starts `codespec lsp` and shows its inline completions.
--
-- Neovim 0.12+: the built-in LSP client (vim.lsp.config / vim.lsp.enable) and
-- vim.lsp.inline_completion render the ghost text; <Tab> accepts.
-- Older versions (0.9-0.11): vim.lsp.start per buffer, and this plugin asks for
-- textDocument/inlineCompletion itself after a pause in typing and draws the
-- suggestion as extmark virtual text; <Tab> accepts, <C-]> dismisses.
-- Next edits (lua/codespec/next_edit.lua): after a pause in typing, the edit the model
-- predicts after the recent ones, shown as virtual text where it lands; <Tab> jumps to
-- it, then applies it.
local M = {}
local next_edit = require("codespec.next_edit")

M.defaults = {
  cmd = { "codespec", "lsp" }, -- e.g. { "/path/to/.venv/bin/codespec", "lsp" }
  server_url = nil, -- a running `codespec serve`: adds --server URL
  shared = true, -- without server_url: one model server for every editor (adds --shared)
  filetypes = nil, -- nil: every buffer with a file
  root_markers = { ".git", "pyproject.toml", "package.json" },
  init_options = { maxTokens = 128, debounceMs = 40, multiline = true, indexWorkspace = true },
  accept_key = "<Tab>",
  dismiss_key = "<C-]>",
  debounce_ms = 150, -- fallback only: pause before asking
  next_edits = true, -- suggest the next edit after a pause in typing
  next_edit_debounce_ms = 400,
  next_edit_key = "<Tab>", -- normal mode; in insert mode <Tab> takes ghost text first
}

local ns = vim.api.nvim_create_namespace("codespec")
local state = { config = nil, timer = nil, shown = nil }

local function has_native_inline()
  return vim.lsp.inline_completion ~= nil and vim.fn.has("nvim-0.12") == 1
end

local function command(config)
  local cmd = vim.deepcopy(config.cmd)
  if config.server_url then
    vim.list_extend(cmd, { "--server", config.server_url })
  elseif config.shared then
    table.insert(cmd, "--shared")
  end
  return cmd
end

--- The server's `codespec/status` in words: loading, indexing 40%, ready, error, or
--- busy while a completion is computed.
local function status_label(result)
  local value = result and result.state or "unknown"
  local message = result and result.message or ""
  if value == "busy" and (message:find("^loading") or message == "starting") then
    return "loading" -- the model loads (the first start prepares it: a minute or more)
  end
  if value == "indexing" then
    local percent = message:match("^(%d+)%%")
    return percent and ("indexing " .. percent .. "%") or "indexing"
  end
  return value
end

-- Said once per change of phase (not for each completion's busy and ready): the start
-- takes a while the first time, and the person should know why nothing shows yet.
local function announce(label, message)
  local phase = label:match("^%a+")
  if phase == state.phase or phase == "busy" or (phase == "ready" and state.phase == nil) then
    state.phase = phase ~= "busy" and phase or state.phase
    return
  end
  state.phase = phase
  -- one short line each: a message wider than the command line makes Neovim's own
  -- notify stop at a "Press ENTER" prompt, which would swallow the person's next keys
  local function say(text, level)
    vim.notify(text:sub(1, math.max(vim.v.echospace - 1, 24)), level)
  end
  if phase == "loading" then
    say("codespec: loading the model", vim.log.levels.INFO)
  elseif phase == "indexing" then
    say("codespec: indexing the workspace", vim.log.levels.INFO)
  elseif phase == "ready" then
    say("codespec: ready", vim.log.levels.INFO)
  elseif phase == "error" then
    say("codespec: " .. (message ~= "" and message or "error"), vim.log.levels.ERROR)
  end
end

local function on_status(_, result)
  local label = status_label(result)
  announce(label, result and result.message or "")
  state.status = label
  vim.g.codespec_status = label
  vim.cmd("redrawstatus")
end

--- The client's status for a statusline: `%{v:lua.require'codespec'.status()}`, e.g.
--- "codespec:loading", "codespec:indexing 40%", "codespec:ready", "codespec:error".
function M.status()
  return "codespec:" .. (state.status or "off")
end

--- The folder a buffer's server is rooted at: the nearest folder above its file with a
--- root marker, else the file's own folder; nil for a buffer with no file (the empty
--- [No Name] buffer, a scratch buffer), which gets no server: one server per root, and
--- none indexing whatever folder Neovim was started in.
local function root_of(bufnr, markers)
  local name = vim.api.nvim_buf_get_name(bufnr)
  if name == "" or vim.bo[bufnr].buftype ~= "" then
    return nil
  end
  local marker = vim.fs.find(markers, { upward = true, path = vim.fs.dirname(name) })[1]
  return marker and vim.fs.dirname(marker) or vim.fs.dirname(name)
end
M.root_of = root_of

-- -- fallback ghost text (before Neovim 0.12) ---------------------------------------
local function clear()
  vim.api.nvim_buf_clear_namespace(0, ns, 0, -1)
  state.shown = nil
end

--- The item's text, and how many characters after the cursor it replaces (a closer the
--- editor auto-inserted that the completion writes itself: codespec sends such a range).
local function item_text(item, row, col)
  local text = item.insertText
  if type(text) == "table" then
    text = text.value
  end
  local replaced = 0
  local range = item.range
  if range and range["end"].line == row - 1 and range["end"].character > col then
    replaced = range["end"].character - col
  end
  return text, replaced
end

--- Ghost text for the first line around the characters it keeps: `include) == names` over
--- an existing `)` shows `include` before it and ` == names` after it.
local function first_line_marks(bufnr, row, col, first, kept)
  local at, start = 0, 1
  for i = 1, #kept do
    local found = first:find(kept:sub(i, i), start, true)
    if not found then
      break
    end
    if found > start then
      vim.api.nvim_buf_set_extmark(bufnr, ns, row - 1, col + at, {
        virt_text = { { first:sub(start, found - 1), "Comment" } }, virt_text_pos = "inline" })
    end
    at, start = at + 1, found + 1
  end
  return first:sub(start), col + at
end

local function show(bufnr, item)
  clear()
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  local text, replaced = item_text(item, row, col)
  if not text or text == "" then
    return
  end
  local lines = vim.split(text, "\n", { plain = true })
  local line = vim.api.nvim_buf_get_lines(bufnr, row - 1, row, false)[1] or ""
  local tail, tail_col = first_line_marks(bufnr, row, col, lines[1], line:sub(col + 1, col + replaced))
  local virt_lines = {}
  for i = 2, #lines do
    table.insert(virt_lines, { { lines[i], "Comment" } })
  end
  vim.api.nvim_buf_set_extmark(bufnr, ns, row - 1, tail_col, {
    virt_text = { { tail, "Comment" } },
    virt_text_pos = "inline",
    virt_lines = #virt_lines > 0 and virt_lines or nil,
  })
  state.shown = { bufnr = bufnr, row = row, col = col, lines = lines, replaced = replaced, item = item }
end

local function request(bufnr)
  local client = vim.lsp.get_clients({ bufnr = bufnr, name = "codespec" })[1]
  if not client then
    return
  end
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = 2 } -- automatic
  client:request("textDocument/inlineCompletion", params, function(err, result)
    if err or not result or vim.api.nvim_get_mode().mode ~= "i" then
      return
    end
    local items = result.items or result
    if items[1] then
      show(bufnr, items[1])
    end
  end, bufnr)
end

-- Runs after the <Tab> mapping has returned (vim.schedule): an `expr` mapping may not
-- change the buffer (E565: Not allowed to change text).
local function accept(shown)
  if vim.api.nvim_get_current_buf() ~= shown.bufnr then
    return
  end
  local row, col = shown.row, shown.col
  vim.api.nvim_buf_set_text(shown.bufnr, row - 1, col, row - 1, col + shown.replaced, shown.lines)
  local last = shown.lines[#shown.lines]
  vim.api.nvim_win_set_cursor(0, { row + #shown.lines - 1, (#shown.lines == 1 and col or 0) + #last })
  local cmd = shown.item.command
  if cmd then
    local client = vim.lsp.get_clients({ bufnr = shown.bufnr, name = "codespec" })[1]
    if client then
      client:request("workspace/executeCommand", { command = cmd.command, arguments = cmd.arguments })
    end
  end
end

local function fallback(bufnr, config)
  local group = vim.api.nvim_create_augroup("codespec_ghost_" .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd({ "TextChangedI", "CursorMovedI" }, {
    group = group,
    buffer = bufnr,
    callback = function()
      clear()
      if state.timer then
        state.timer:stop()
      end
      state.timer = vim.defer_fn(function()
        request(bufnr)
      end, config.debounce_ms)
    end,
  })
  vim.api.nvim_create_autocmd("InsertLeave", { group = group, buffer = bufnr, callback = clear })
  vim.keymap.set("i", config.accept_key, function()
    local shown = state.shown
    if not shown then
      if config.next_edits and next_edit.tab() then
        return ""
      end
      return vim.api.nvim_replace_termcodes(config.accept_key, true, false, true)
    end
    clear()
    vim.schedule(function()
      accept(shown)
    end)
    return ""
  end, { buffer = bufnr, expr = true, desc = "codespec: accept the suggestion" })
  vim.keymap.set("i", config.dismiss_key, function()
    clear()
    next_edit.clear(bufnr)
  end, { buffer = bufnr, desc = "codespec: dismiss the suggestion" })
end

-- -- set-up -------------------------------------------------------------------------
function M.setup(opts)
  local config = vim.tbl_deep_extend("force", M.defaults, opts or {})
  state.config = config
  local handlers = { ["codespec/status"] = on_status }
  if vim.lsp.config and vim.lsp.enable then -- Neovim 0.11+
    vim.lsp.config("codespec", {
      cmd = command(config),
      filetypes = config.filetypes,
      -- a function: a buffer whose root is nil (no file) is not attached at all
      root_dir = function(bufnr, on_dir)
        local root = root_of(bufnr, config.root_markers)
        if root then
          on_dir(root)
        end
      end,
      init_options = config.init_options,
      handlers = handlers,
    })
    vim.lsp.enable("codespec")
  else -- Neovim 0.9/0.10
    local function start(bufnr)
      local root = root_of(bufnr, config.root_markers)
      if not root or (config.filetypes and not vim.tbl_contains(config.filetypes, vim.bo[bufnr].filetype)) then
        return
      end
      vim.lsp.start({
        name = "codespec",
        cmd = command(config),
        root_dir = root,
        init_options = config.init_options,
        handlers = handlers,
      }, { bufnr = bufnr })
    end
    vim.api.nvim_create_autocmd("FileType", {
      group = vim.api.nvim_create_augroup("codespec_start", { clear = true }),
      callback = function(args)
        start(args.buf)
      end,
    })
    for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do -- set up after start-up: the buffers already open
      if vim.api.nvim_buf_is_loaded(bufnr) then
        start(bufnr)
      end
    end
  end
  vim.api.nvim_create_autocmd("LspAttach", {
    group = vim.api.nvim_create_augroup("codespec_attach", { clear = true }),
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if not client or client.name ~= "codespec" then
        return
      end
      if not state.status then
        state.status = "starting"
        vim.g.codespec_status = "starting"
      end
      if has_native_inline() then
        vim.lsp.inline_completion.enable(true, { bufnr = args.buf })
        vim.keymap.set("i", config.accept_key, function()
          if not vim.lsp.inline_completion.get() and not (config.next_edits and next_edit.tab()) then
            return vim.api.nvim_replace_termcodes(config.accept_key, true, false, true)
          end
        end, { buffer = args.buf, expr = true, desc = "codespec: accept the suggestion" })
      else
        fallback(args.buf, config)
      end
      if config.next_edits then
        next_edit.attach(args.buf, config)
      end
    end,
  })
end

return M
