// codespec for VS Code: starts `codespec lsp` (alone, or in front of a running `codespec
// serve`) and lets vscode-languageclient turn the server's textDocument/inlineCompletion
// into ghost text. With only `codespec.serverUrl` set and no codespec executable on this
// machine, it asks that server's /infill itself (src/infill.ts). The status bar shows what
// the server reports through `codespec/status`.
import * as vscode from "vscode";
import { LanguageClient, LanguageClientOptions, ServerOptions, State } from "vscode-languageclient/node";
import { InfillProvider } from "./infill";
import { findExecutable } from "./executable";
import { NextEdits } from "./nextEdit";

const SECTION = "codespec";
const NOTHING_HERE = "no suggestion here";
let client: LanguageClient | undefined;
let infill: vscode.Disposable | undefined;
let nextEdits: NextEdits | undefined;
let statusItem: vscode.StatusBarItem;
let output: vscode.LogOutputChannel;
// set while the server starts or loads its model; the first "ready" after it re-asks
let awaitingModel = false;

interface Status {
  state: "busy" | "indexing" | "ready" | "error";
  message?: string;
}

function serverOptions(config: vscode.WorkspaceConfiguration, command: string): ServerOptions {
  const args = ["lsp"];
  const url = config.get<string>("serverUrl", "").trim();
  if (url) {
    args.push("--server", url);
  } else {
    args.push("--model", config.get<string>("model", "default"));
    if (config.get<boolean>("sharedServer", true)) {
      args.push("--shared"); // one model for all windows, not ~2.5 GB each
    }
  }
  return { run: { command, args }, debug: { command, args } };
}

function initializationOptions(config: vscode.WorkspaceConfiguration): Record<string, unknown> {
  return {
    enable: config.get("enable"),
    maxTokens: config.get("maxTokens"),
    debounceMs: config.get("debounceMs"),
    multiline: config.get("multiline"),
    indexWorkspace: config.get("indexWorkspace"),
    contextTokens: config.get("contextTokens"),
  };
}

// The state in words, for the status bar's text: loading, indexing 40%, ready, error
// (a completion being computed shows the spinner beside "working").
export function statusLabel(status: Status): string {
  const message = status.message ?? "";
  if (status.state === "busy") {
    return message === "starting" ? "starting" : message.startsWith("loading") ? "loading" : "working";
  }
  if (status.state === "indexing") {
    const percent = /^(\d+)%/.exec(message);
    return percent ? `indexing ${percent[1]}%` : "indexing";
  }
  return status.state;
}

function showStatus(status: Status): void {
  const icons: Record<Status["state"], string> = {
    busy: "$(loading~spin)",
    indexing: "$(database)",
    ready: "$(check)",
    error: "$(error)",
  };
  const nothing = status.state === "ready" && status.message?.startsWith(NOTHING_HERE);
  statusItem.text = `${nothing ? "$(circle-slash)" : icons[status.state] ?? ""} codespec: ${statusLabel(status)}`;
  statusItem.tooltip = status.message ? `codespec: ${status.state}: ${status.message}` : `codespec: ${status.state}`;
  statusItem.show();
  // The model finished loading: ask again where the cursor is, since a request VS Code
  // gave up on meanwhile is never repeated by it. Only then: every completion turns the
  // status busy and back, and re-asking after each would send a second request per
  // suggestion.
  if (status.state === "busy" && (status.message === "starting" || status.message === "loading the model")) {
    awaitingModel = true;
  } else if (status.state === "error") {
    awaitingModel = false;
  } else if (status.state === "ready" && awaitingModel) {
    awaitingModel = false;
    if (!nothing) {
      void vscode.commands.executeCommand("editor.action.inlineSuggest.trigger");
    }
  }
}

async function stopClient(): Promise<void> {
  // A client that never started (a wrong command) cannot be stopped: stop() throws
  // "Client is not running and can't be stopped" and the restart never happened.
  const current = client;
  client = undefined;
  infill?.dispose();
  infill = undefined;
  nextEdits?.dispose();
  nextEdits = undefined;
  if (!current) {
    return;
  }
  try {
    if (current.state === State.Running || current.state === State.Starting) {
      await current.stop(2000);
    } else {
      await current.dispose(2000);
    }
  } catch (error) {
    output.warn(`stopping the language server: ${error}`);
  }
}

async function failed(message: string): Promise<void> {
  showStatus({ state: "error", message });
  output.error(message);
  const choice = await vscode.window.showErrorMessage(`codespec: ${message}`, "Open settings", "Show log");
  if (choice === "Open settings") {
    void vscode.commands.executeCommand("workbench.action.openSettings", "codespec.command");
  } else if (choice === "Show log") {
    output.show();
  }
}

async function start(context: vscode.ExtensionContext): Promise<void> {
  await stopClient();
  const config = vscode.workspace.getConfiguration(SECTION);
  const url = config.get<string>("serverUrl", "").trim();
  const configured = config.get<string>("command", "codespec");
  const command = await findExecutable(configured);
  if (!command) {
    if (url) {
      // No codespec here, but a server to ask: its /infill, straight from the editor.
      infill = vscode.languages.registerInlineCompletionItemProvider(
        { pattern: "**" }, new InfillProvider(url, config, output, showStatus));
      output.info(`\`${configured}\` not found: completions come from ${url}/infill`);
      showStatus({ state: "ready", message: `${url}/infill` });
      return;
    }
    await failed(`\`${configured}\` was not found. Set codespec.command to the codespec executable `
      + "(e.g. /path/to/.venv/bin/codespec), or codespec.serverUrl to a running `codespec serve`.");
    return;
  }
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
    initializationOptions: initializationOptions(config),
    synchronize: { configurationSection: SECTION },
    outputChannel: output,
  };
  const started = new LanguageClient("codespec", "codespec", serverOptions(config, command), clientOptions);
  client = started;
  context.subscriptions.push(
    started.onNotification("codespec/status", (status: Status) => showStatus(status)),
    started.onDidChangeState((event) => {
      if (event.newState === State.Stopped && client === started) {
        showStatus({ state: "error", message: "the language server stopped" });
      }
    }),
  );
  showStatus({ state: "busy", message: "starting" });
  try {
    await started.start();
  } catch (error) {
    await failed(`could not start \`${command} lsp\`: ${error}`);
    return;
  }
  if (client === started) {
    nextEdits = new NextEdits(started, output);
  }
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  // The server sends its log as window/logMessage, each line at its level; the language
  // client writes whatever reaches stderr here marked [error], so the server keeps stderr quiet.
  output = vscode.window.createOutputChannel("codespec", { log: true });
  statusItem = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  statusItem.command = "codespec.showOutput";
  context.subscriptions.push(
    output,
    statusItem,
    vscode.commands.registerCommand("codespec.showOutput", () => output.show()),
    vscode.commands.registerCommand("codespec.restart", () => start(context)),
    vscode.commands.registerCommand("codespec.nextEdit.accept", () => nextEdits?.accept()),
    vscode.commands.registerCommand("codespec.nextEdit.dismiss", () => nextEdits?.clear()),
    vscode.commands.registerCommand("codespec.nextEdit.suggest", () => {
      const editor = vscode.window.activeTextEditor;
      return editor && nextEdits?.ask(editor);
    }),
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      // the server command, URL or model changed: a new server; other settings reach a
      // running one through didChangeConfiguration
      if (["command", "serverUrl", "model", "sharedServer"].some((key) => event.affectsConfiguration(`${SECTION}.${key}`))
          || (!client && event.affectsConfiguration(SECTION))) {
        await start(context);
      }
    }),
  );
  await start(context);
}

export async function deactivate(): Promise<void> {
  await stopClient();
}
