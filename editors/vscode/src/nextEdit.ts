// Next-edit suggestions with VS Code's stable API. After a pause in typing the extension
// asks the language server's `textDocument/copilotInlineEdit` for the edit the model
// predicts after the recent ones, and shows it where it lands: the text it replaces
// struck through, the new text beside it (decorations), a hover with the whole change,
// and a status bar item saying where it is. Tab jumps to an edit away from the cursor,
// then applies it; Escape dismisses it. Ghost text at the cursor comes first: Tab
// accepts an inline suggestion while one is shown (the keybinding's `when`).
import * as vscode from "vscode";
import { LanguageClient } from "vscode-languageclient/node";

export const SHOWN_CONTEXT = "codespec.nextEditShown";
const METHOD = "textDocument/copilotInlineEdit";
const SHOWN = "textDocument/didShowInlineEdit";

interface WireRange {
  start: { line: number; character: number };
  end: { line: number; character: number };
}

interface WireEdit {
  text: string;
  range: WireRange;
  textDocument: { uri: string; version: number | null };
  command?: { title: string; command: string; arguments?: unknown[] };
}

interface Shown {
  editor: vscode.TextEditor;
  version: number;
  range: vscode.Range;
  text: string;
  command?: WireEdit["command"];
}

// One changed stretch of a line, for the decorations: `range` in the document, what it
// becomes. Lines the edit adds are shown after the last line it touches.
interface Piece {
  range: vscode.Range;
  inserted: string;
}

/** The edit's changes line by line, each trimmed to the characters that differ, so a
 * renamed word shows as that word struck through and its new name beside it. */
export function pieces(document: vscode.TextDocument, range: vscode.Range, text: string): Piece[] {
  const before = document.getText(range).split("\n");
  const after = text.split("\n");
  const out: Piece[] = [];
  const common = Math.min(before.length, after.length);
  for (let i = 0; i < common; i++) {
    const old = before[i];
    const now = i === common - 1 ? after.slice(i).join("\n") : after[i];
    const last = i === common - 1 ? before.slice(i).join("\n") : old;
    if (last === now) {
      continue;
    }
    let head = 0;
    while (head < last.length && head < now.length && last[head] === now[head]) {
      head++;
    }
    let tail = 0;
    while (tail < last.length - head && tail < now.length - head
           && last[last.length - 1 - tail] === now[now.length - 1 - tail]) {
      tail++;
    }
    const line = range.start.line + i;
    const column = i === 0 ? range.start.character : 0;
    const start = document.positionAt(document.offsetAt(new vscode.Position(line, column)) + head);
    const end = document.positionAt(document.offsetAt(new vscode.Position(line, column)) + last.length - tail);
    out.push({ range: new vscode.Range(start, end), inserted: now.slice(head, now.length - tail) });
  }
  return out;
}

export class NextEdits implements vscode.Disposable {
  private readonly removed = vscode.window.createTextEditorDecorationType({
    textDecoration: "line-through",
    backgroundColor: new vscode.ThemeColor("diffEditor.removedTextBackground"),
  });
  private readonly added = vscode.window.createTextEditorDecorationType({});
  private readonly statusItem = vscode.window.createStatusBarItem("codespec.nextEdit", vscode.StatusBarAlignment.Right, 99);
  private readonly disposables: vscode.Disposable[] = [];
  private timer: ReturnType<typeof setTimeout> | undefined;
  private asking: vscode.CancellationTokenSource | undefined;
  private shown: Shown | undefined;
  private applying = false;

  constructor(private readonly client: LanguageClient, private readonly output: vscode.LogOutputChannel) {
    this.statusItem.name = "codespec next edit";
    this.statusItem.command = "codespec.nextEdit.accept";
    this.disposables.push(
      vscode.workspace.onDidChangeTextDocument((event) => this.changed(event)),
      vscode.window.onDidChangeActiveTextEditor(() => this.clear()),
    );
  }

  private changed(event: vscode.TextDocumentChangeEvent): void {
    const editor = vscode.window.activeTextEditor;
    if (!editor || event.document !== editor.document || event.contentChanges.length === 0 || this.applying) {
      return;
    }
    this.clear(); // the text it was computed for is gone
    const config = vscode.workspace.getConfiguration("codespec"); // read now: a snapshot goes stale
    if (!config.get<boolean>("nextEdits", true) || !config.get<boolean>("enable", true)) {
      return;
    }
    this.schedule(editor, config.get<number>("nextEditDebounceMs", 400));
  }

  private schedule(editor: vscode.TextEditor, delay: number): void {
    if (this.timer) {
      clearTimeout(this.timer);
    }
    this.timer = setTimeout(() => void this.ask(editor), delay);
  }

  /** Ask for the next edit at the editor's cursor; show it if the document has not changed meanwhile. */
  async ask(editor: vscode.TextEditor): Promise<void> {
    this.asking?.cancel();
    const asking = new vscode.CancellationTokenSource();
    this.asking = asking;
    const document = editor.document;
    const version = document.version;
    const position = editor.selection.active;
    let result: { edits?: WireEdit[] } | null;
    try {
      result = await this.client.sendRequest(METHOD, {
        textDocument: { uri: document.uri.toString(), version },
        position: { line: position.line, character: position.character },
      }, asking.token);
    } catch (error) {
      if (!asking.token.isCancellationRequested) {
        this.output.warn(`next edit: ${error}`);
      }
      return;
    }
    const edit = result?.edits?.[0];
    if (asking.token.isCancellationRequested || !edit || document.version !== version
        || vscode.window.activeTextEditor?.document !== document) {
      return;
    }
    const range = new vscode.Range(edit.range.start.line, edit.range.start.character,
                                   edit.range.end.line, edit.range.end.character);
    // the server's text has "\n" line ends; the document's own, in a CRLF file
    const text = document.eol === vscode.EndOfLine.CRLF ? edit.text.replace(/\r?\n/g, "\r\n") : edit.text;
    if (document.getText(range) === text) {
      return;
    }
    this.show({ editor: vscode.window.activeTextEditor, version, range, text, command: edit.command });
    void this.client.sendNotification(SHOWN, { item: edit });
  }

  private show(shown: Shown): void {
    this.shown = shown;
    const { editor, range, text } = shown;
    const changes = pieces(editor.document, range, text);
    const hover = new vscode.MarkdownString();
    hover.appendMarkdown("**codespec** suggests (Tab to apply, Escape to dismiss):\n");
    hover.appendCodeblock(diff(editor.document.getText(range), text), "diff");
    editor.setDecorations(this.removed, changes.filter((p) => !p.range.isEmpty)
      .map((p) => ({ range: p.range, hoverMessage: hover })));
    editor.setDecorations(this.added, changes.filter((p) => p.inserted !== "").map((p) => ({
      range: new vscode.Range(p.range.end, p.range.end),
      hoverMessage: hover,
      renderOptions: {
        after: {
          contentText: p.inserted.replace(/\n/g, " ⏎ "),
          color: new vscode.ThemeColor("editorGhostText.foreground"),
          backgroundColor: new vscode.ThemeColor("diffEditor.insertedTextBackground"),
        },
      },
    })));
    const line = range.start.line + 1;
    this.statusItem.text = `$(sparkle) edit at line ${line}: Tab`;
    this.statusItem.tooltip = `codespec: a next edit at line ${line} (Tab jumps to it, Tab again applies it, Escape dismisses it)`;
    this.statusItem.show();
    void vscode.commands.executeCommand("setContext", SHOWN_CONTEXT, true);
  }

  clear(): void {
    if (this.timer) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    this.asking?.cancel();
    if (!this.shown) {
      return;
    }
    this.shown.editor.setDecorations(this.removed, []);
    this.shown.editor.setDecorations(this.added, []);
    this.shown = undefined;
    this.statusItem.hide();
    void vscode.commands.executeCommand("setContext", SHOWN_CONTEXT, false);
  }

  /** Tab: to the edit when the cursor is away from its lines, else apply it. */
  async accept(): Promise<void> {
    const shown = this.shown;
    const editor = vscode.window.activeTextEditor;
    if (!shown || editor !== shown.editor || editor.document.version !== shown.version) {
      this.clear();
      return;
    }
    const line = editor.selection.active.line;
    if (line < shown.range.start.line || line > shown.range.end.line) {
      editor.selection = new vscode.Selection(shown.range.start, shown.range.start);
      editor.revealRange(shown.range, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
      return;
    }
    this.applying = true;
    let applied = false;
    try {
      applied = await editor.edit((builder) => builder.replace(shown.range, shown.text));
    } finally {
      this.applying = false;
    }
    this.clear();
    if (!applied) {
      return;
    }
    if (shown.command) {
      void vscode.commands.executeCommand(shown.command.command, ...(shown.command.arguments ?? []));
    }
    // an applied edit is one more change: the edit after it, at once
    this.schedule(editor, 0);
  }

  dispose(): void {
    this.clear();
    for (const d of [...this.disposables, this.removed, this.added, this.statusItem]) {
      d.dispose();
    }
  }
}

/** A line diff of the change for the hover: the old lines with -, the new with +. */
function diff(before: string, after: string): string {
  const lines = (text: string, sign: string) => text.split("\n").map((l) => `${sign} ${l}`);
  return [...lines(before, "-"), ...lines(after, "+")].join("\n");
}
