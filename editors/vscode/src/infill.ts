// Completions straight from a running `codespec serve` (its llama.cpp-style /infill), for a
// machine where only `codespec.serverUrl` is set and no codespec executable is installed.
// The request is llama.vim's: the lines before the cursor's line, the typed part of the line
// as `prompt` (the server holds back its trailing spaces for the model to write), the rest
// of the line and the lines after it as the suffix, `n_indent` for a blank line.
import * as vscode from "vscode";

const PREFIX_LINES = 256;
const SUFFIX_LINES = 64;

interface Status {
  state: "busy" | "indexing" | "ready" | "error";
  message?: string;
}

export class InfillProvider implements vscode.InlineCompletionItemProvider {
  constructor(
    private readonly url: string,
    private readonly config: vscode.WorkspaceConfiguration,
    private readonly output: vscode.LogOutputChannel,
    private readonly report: (status: Status) => void,
  ) {}

  async provideInlineCompletionItems(document: vscode.TextDocument, position: vscode.Position,
    _context: vscode.InlineCompletionContext, token: vscode.CancellationToken): Promise<vscode.InlineCompletionItem[]> {
    if (this.config.get<boolean>("enable") === false) {
      return [];
    }
    const debounce = this.config.get<number>("debounceMs", 40);
    await new Promise((resolve) => setTimeout(resolve, debounce));
    if (token.isCancellationRequested) {
      return [];
    }
    const line = document.lineAt(position.line).text;
    const typed = line.slice(0, position.character);
    const blank = typed.trim() === "";
    const first = Math.max(0, position.line - PREFIX_LINES);
    const last = Math.min(document.lineCount - 1, position.line + SUFFIX_LINES);
    const prefix = document.getText(new vscode.Range(first, 0, position.line, 0));
    const suffix = line.slice(position.character) + "\n"
      + (position.line < last ? document.getText(new vscode.Range(position.line + 1, 0, last + 1, 0)) : "");
    const body = {
      input_prefix: prefix, input_suffix: suffix, prompt: blank ? "" : typed,
      n_predict: this.config.get<number>("maxTokens", 128),
      n_indent: blank ? typed.length : 0,
      cache_prompt: true, stream: false,
      response_fields: ["content"],
    };
    const abort = new AbortController();
    const cancelled = token.onCancellationRequested(() => abort.abort());
    try {
      this.report({ state: "busy" });
      const response = await fetch(`${this.url.replace(/\/$/, "")}/infill`, {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
        signal: abort.signal,
      });
      if (!response.ok) {
        throw new Error(`${response.status} ${await response.text()}`);
      }
      let content = ((await response.json()) as { content?: string }).content ?? "";
      if (blank && content.startsWith(typed)) {
        content = content.slice(typed.length); // the model wrote the line's indentation too
      }
      this.report({ state: "ready" });
      return content.trim() ? [new vscode.InlineCompletionItem(content, new vscode.Range(position, position))] : [];
    } catch (error) {
      if (!abort.signal.aborted) {
        this.output.error(`${this.url}/infill: ${error}`);
        this.report({ state: "error", message: `${this.url}/infill: ${error}` });
      }
      return [];
    } finally {
      cancelled.dispose();
    }
  }
}
