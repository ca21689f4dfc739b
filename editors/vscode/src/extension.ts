// codespec for VS Code: starts `codespec lsp` (or connects it to a running `codespec serve`)
// and lets vscode-languageclient turn the server's textDocument/inlineCompletion into
// ghost text. The status bar shows what the server reports through `codespec/status`.
import * as vscode from "vscode";
import { LanguageClient, LanguageClientOptions, ServerOptions, State } from "vscode-languageclient/node";

const SECTION = "codespec";
let client: LanguageClient | undefined;
let statusItem: vscode.StatusBarItem;
let output: vscode.LogOutputChannel;

interface Status {
  state: "busy" | "indexing" | "ready" | "error";
  message?: string;
}

function serverOptions(config: vscode.WorkspaceConfiguration): ServerOptions {
  const args = ["lsp"];
  const url = config.get<string>("serverUrl", "").trim();
  if (url) {
    args.push("--server", url);
  } else {
    args.push("--model", config.get<string>("model", "default"));
  }
  const command = config.get<string>("command", "codespec");
  return { run: { command, args }, debug: { command, args } };
}

function initializationOptions(config: vscode.WorkspaceConfiguration): Record<string, unknown> {
  return {
    enable: config.get("enable"),
    maxTokens: config.get("maxTokens"),
    debounceMs: config.get("debounceMs"),
    multiline: config.get("multiline"),
    indexWorkspace: config.get("indexWorkspace"),
  };
}

function showStatus(status: Status): void {
  const icons: Record<Status["state"], string> = {
    busy: "$(loading~spin)",
    indexing: "$(database)",
    ready: "$(check)",
    error: "$(error)",
  };
  statusItem.text = `${icons[status.state] ?? ""} codespec`;
  statusItem.tooltip = status.message ? `codespec: ${status.state}: ${status.message}` : `codespec: ${status.state}`;
  statusItem.show();
}

async function start(context: vscode.ExtensionContext): Promise<void> {
  const config = vscode.workspace.getConfiguration(SECTION);
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
    initializationOptions: initializationOptions(config),
    synchronize: { configurationSection: SECTION },
    outputChannel: output,
  };
  client = new LanguageClient("codespec", "codespec", serverOptions(config), clientOptions);
  context.subscriptions.push(
    client.onNotification("codespec/status", (status: Status) => showStatus(status)),
    client.onDidChangeState((event) => {
      if (event.newState === State.Stopped) {
        showStatus({ state: "error", message: "the language server stopped" });
      }
    }),
  );
  showStatus({ state: "indexing", message: "starting" });
  try {
    await client.start();
  } catch (error) {
    showStatus({ state: "error", message: String(error) });
    void vscode.window.showErrorMessage(
      `codespec: could not start \`${config.get("command")} lsp\` (${error}). Set codespec.command to the codespec executable.`,
    );
  }
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  output = vscode.window.createOutputChannel("codespec", { log: true });
  statusItem = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  statusItem.command = "codespec.showOutput";
  context.subscriptions.push(
    output,
    statusItem,
    vscode.commands.registerCommand("codespec.showOutput", () => output.show()),
    vscode.commands.registerCommand("codespec.restart", async () => {
      await client?.stop();
      await start(context);
    }),
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      // the server command or URL changed: a new server; other settings reach it through didChangeConfiguration
      if (event.affectsConfiguration(`${SECTION}.command`) || event.affectsConfiguration(`${SECTION}.serverUrl`)
          || event.affectsConfiguration(`${SECTION}.model`)) {
        await client?.stop();
        await start(context);
      }
    }),
  );
  await start(context);
}

export async function deactivate(): Promise<void> {
  await client?.stop();
}
