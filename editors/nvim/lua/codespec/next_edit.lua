-- Next-edit suggestions: after a pause in typing, ask `codespec lsp` for the edit the model
-- predicts after the recent ones (`textDocument/copilotInlineEdit`) and show it where it
-- lands as virtual text: the characters it replaces struck through, the new ones beside
-- them, the lines it adds below, and a pointer at the cursor's line when it is elsewhere.
-- <Tab> (normal mode, and insert mode when no ghost text is shown) jumps to an edit away
-- from the cursor, then applies it; <C-]> dismisses it. Any change to the buffer drops it.
local M = {}

local ns = vim.api.nvim_create_namespace("codespec_next_edit")
local METHOD = "textDocument/copilotInlineEdit"
local state = { timer = nil, shown = nil }

vim.api.nvim_set_hl(0, "CodespecEditDelete", { default = true, link = "DiffDelete" })
vim.api.nvim_set_hl(0, "CodespecEditAdd", { default = true, link = "DiffAdd" })
vim.api.nvim_set_hl(0, "CodespecEditHint", { default = true, link = "Comment" })

local function client_of(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr, name = "codespec" })[1]
end

--- A position from the server (line, character in the client's encoding) as a 0-based
--- row and byte column of the buffer.
local function byte_position(bufnr, position, encoding)
  local line = vim.api.nvim_buf_get_lines(bufnr, position.line, position.line + 1, false)[1] or ""
  if encoding == "utf-8" then
    return position.line, math.min(position.character, #line)
  end
  -- Neovim 0.11 takes (s, encoding, index, strict); 0.9/0.10 take (s, index, use_utf16)
  local ok, col = pcall(vim.str_byteindex, line, encoding, position.character, false)
  if not ok or type(col) ~= "number" then
    ok, col = pcall(vim.str_byteindex, line, position.character, encoding == "utf-16")
  end
  return position.line, ok and col or #line
end

function M.clear(bufnr)
  if state.shown then
    pcall(vim.api.nvim_buf_clear_namespace, state.shown.bufnr, ns, 0, -1)
  elseif bufnr then
    vim.api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  end
  state.shown = nil
end

function M.shown()
  return state.shown
end

--- The change line by line, each line trimmed to the characters that differ; the last
--- common line takes the lines one side has more of.
local function pieces(old_lines, new_lines)
  local out = {}
  local common = math.min(#old_lines, #new_lines)
  for i = 1, common do
    local old = i == common and table.concat(old_lines, "\n", i) or old_lines[i]
    local new = i == common and table.concat(new_lines, "\n", i) or new_lines[i]
    if old ~= new then
      local head = 0
      while head < #old and head < #new and old:sub(head + 1, head + 1) == new:sub(head + 1, head + 1) do
        head = head + 1
      end
      local tail = 0
      while tail < #old - head and tail < #new - head
        and old:sub(#old - tail, #old - tail) == new:sub(#new - tail, #new - tail) do
        tail = tail + 1
      end
      table.insert(out, { index = i, head = head, removed = old:sub(head + 1, #old - tail),
                          inserted = new:sub(head + 1, #new - tail) })
    end
  end
  return out
end

local function show(bufnr, edit, encoding)
  M.clear(bufnr)
  local srow, scol = byte_position(bufnr, edit.range.start, encoding)
  local erow, ecol = byte_position(bufnr, edit.range["end"], encoding)
  local old_lines = vim.api.nvim_buf_get_text(bufnr, srow, scol, erow, ecol, {})
  local new_lines = vim.split(edit.text, "\n", { plain = true })
  if table.concat(old_lines, "\n") == edit.text then
    return
  end
  for _, piece in ipairs(pieces(old_lines, new_lines)) do
    -- where the piece starts: its line, and its column (the edit's own on its first line)
    local row = srow + piece.index - 1
    local col = (piece.index == 1 and scol or 0) + piece.head
    local removed = vim.split(piece.removed, "\n", { plain = true })
    local end_row = row + #removed - 1
    local end_col = (#removed == 1 and col or 0) + #removed[#removed]
    if piece.removed ~= "" then
      vim.api.nvim_buf_set_extmark(bufnr, ns, row, col, {
        end_row = end_row, end_col = end_col, hl_group = "CodespecEditDelete", strict = false })
    end
    if piece.inserted ~= "" then
      local inserted = vim.split(piece.inserted, "\n", { plain = true })
      local virt_lines = {}
      for i = 2, #inserted do
        table.insert(virt_lines, { { inserted[i], "CodespecEditAdd" } })
      end
      vim.api.nvim_buf_set_extmark(bufnr, ns, end_row, end_col, {
        virt_text = { { inserted[1], "CodespecEditAdd" } }, virt_text_pos = "inline",
        virt_lines = #virt_lines > 0 and virt_lines or nil, strict = false })
    end
  end
  local cursor = vim.api.nvim_win_get_cursor(0)[1] - 1
  if cursor < srow or cursor > erow then
    vim.api.nvim_buf_set_extmark(bufnr, ns, cursor, 0, {
      virt_text = { { ("  codespec: edit at line %d (%s)"):format(srow + 1, state.key or "<Tab>"), "CodespecEditHint" } },
      virt_text_pos = "eol" })
  end
  state.shown = { bufnr = bufnr, tick = vim.b[bufnr].changedtick, srow = srow, scol = scol, erow = erow,
                  ecol = ecol, lines = new_lines, command = edit.command }
end

--- Ask for the next edit at the cursor; shown if the buffer has not changed meanwhile.
function M.ask(bufnr)
  local client = client_of(bufnr)
  if not client then
    return
  end
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  local versions = vim.lsp.util.buf_versions
  params.textDocument.version = versions and versions[bufnr] or nil
  local tick = vim.b[bufnr].changedtick
  client:request(METHOD, params, function(err, result)
    local edit = not err and result and result.edits and result.edits[1]
    if not edit or not vim.api.nvim_buf_is_valid(bufnr) or vim.b[bufnr].changedtick ~= tick
        or vim.api.nvim_get_current_buf() ~= bufnr then
      return
    end
    show(bufnr, edit, client.offset_encoding)
    if state.shown then
      client:notify("textDocument/didShowInlineEdit", { item = edit })
    end
  end, bufnr)
end

--- <Tab>: to the edit when the cursor is away from its lines, else apply it. False when
--- there is no edit to go to (the key does what it does without codespec).
function M.tab()
  local shown = state.shown
  if not shown or shown.bufnr ~= vim.api.nvim_get_current_buf() or vim.b[shown.bufnr].changedtick ~= shown.tick then
    M.clear()
    return false
  end
  vim.schedule(function() -- an `expr` mapping may not change the buffer or move the cursor
    local row = vim.api.nvim_win_get_cursor(0)[1] - 1
    if row < shown.srow or row > shown.erow then
      vim.api.nvim_win_set_cursor(0, { shown.srow + 1, shown.scol })
      return
    end
    M.clear()
    state.applying = true
    vim.api.nvim_buf_set_text(shown.bufnr, shown.srow, shown.scol, shown.erow, shown.ecol, shown.lines)
    state.applying = false
    local last = shown.lines[#shown.lines]
    vim.api.nvim_win_set_cursor(0, { shown.srow + #shown.lines, (#shown.lines == 1 and shown.scol or 0) + #last })
    local client = client_of(shown.bufnr)
    if client and shown.command then
      client:request("workspace/executeCommand", { command = shown.command.command, arguments = shown.command.arguments })
    end
    M.ask(shown.bufnr) -- the applied edit is one more change: the edit after it, at once
  end)
  return true
end

--- Ask after each pause in typing (`config.next_edit_debounce_ms`); set up per buffer.
function M.attach(bufnr, config)
  state.key = config.next_edit_key
  local group = vim.api.nvim_create_augroup("codespec_next_edit_" .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd({ "TextChanged", "TextChangedI" }, {
    group = group,
    buffer = bufnr,
    callback = function()
      if state.applying then
        return
      end
      M.clear(bufnr)
      if state.timer then
        state.timer:stop()
      end
      state.timer = vim.defer_fn(function()
        if vim.api.nvim_buf_is_valid(bufnr) and vim.api.nvim_get_current_buf() == bufnr then
          M.ask(bufnr)
        end
      end, config.next_edit_debounce_ms)
    end,
  })
  vim.api.nvim_create_autocmd("BufLeave", { group = group, buffer = bufnr, callback = function() M.clear(bufnr) end })
  vim.keymap.set("n", config.next_edit_key, function()
    if M.tab() then
      return ""
    end
    return vim.api.nvim_replace_termcodes(config.next_edit_key, true, false, true)
  end, { buffer = bufnr, expr = true, desc = "codespec: go to or apply the suggested edit" })
  vim.keymap.set("n", config.dismiss_key, function()
    M.clear(bufnr)
  end, { buffer = bufnr, desc = "codespec: dismiss the suggested edit" })
end

return M
