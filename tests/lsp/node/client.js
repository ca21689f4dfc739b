// End-to-end: drive `codespec lsp` with Microsoft's vscode-languageserver-protocol client,
// as the VS Code extension's language client does. Usage:
//   PYTHON=.venv/bin/python node client.js WORKSPACE_DIR FILE LINE CHARACTER
// Prints "1 passed" or exits non-zero with the reason.
const cp = require("child_process");
const fs = require("fs");
const path = require("path");
const { pathToFileURL } = require("url");
const assert = require("assert");
const {
  createProtocolConnection, StreamMessageReader, StreamMessageWriter, InitializeRequest,
  InitializedNotification, DidOpenTextDocumentNotification, InlineCompletionRequest,
  InlineCompletionTriggerKind, ShutdownRequest, ExitNotification, WorkDoneProgressCreateRequest,
} = require("vscode-languageserver-protocol/node");

const [workspace, file, line, character] = process.argv.slice(2);
const timeoutMs = Number(process.env.CODESPEC_TEST_TIMEOUT_MS || 600000);

(async () => {
  const python = process.env.PYTHON || "python3";
  const proc = cp.spawn(python, ["-m", "codespec", "lsp"], { stdio: ["pipe", "pipe", "inherit"] });
  const conn = createProtocolConnection(new StreamMessageReader(proc.stdout), new StreamMessageWriter(proc.stdin));
  const timer = setTimeout(() => { console.error("timed out"); proc.kill(); process.exit(2); }, timeoutMs);
  let resolveReady;
  const ready = new Promise((resolve) => { resolveReady = resolve; });
  conn.onNotification("codespec/status", (status) => {
    if (status.state === "ready" || status.state === "error") resolveReady(status);
  });
  conn.onRequest(WorkDoneProgressCreateRequest.type, () => null);
  conn.listen();

  const rootUri = pathToFileURL(workspace).href;
  const init = await conn.sendRequest(InitializeRequest.type, {
    processId: process.pid, rootUri, workspaceFolders: [{ uri: rootUri, name: "workspace" }],
    capabilities: { textDocument: { inlineCompletion: {} }, window: { workDoneProgress: true } },
    initializationOptions: { maxTokens: 64 },
  });
  assert.ok(init.capabilities.inlineCompletionProvider, "no inlineCompletionProvider");
  await conn.sendNotification(InitializedNotification.type, {});
  const status = await ready;
  assert.strictEqual(status.state, "ready", JSON.stringify(status));

  const full = path.join(workspace, file);
  const uri = pathToFileURL(full).href;
  await conn.sendNotification(DidOpenTextDocumentNotification.type, {
    textDocument: { uri, languageId: "python", version: 1, text: fs.readFileSync(full, "utf8") },
  });
  const result = await conn.sendRequest(InlineCompletionRequest.type, {
    textDocument: { uri }, position: { line: Number(line), character: Number(character) },
    context: { triggerKind: InlineCompletionTriggerKind.Invoked },
  });
  const items = Array.isArray(result) ? result : result.items;
  assert.ok(items.length > 0 && items[0].insertText.trim().length > 0, JSON.stringify(result));
  await conn.sendRequest(ShutdownRequest.type);
  await conn.sendNotification(ExitNotification.type);
  clearTimeout(timer);
  conn.dispose();
  console.log(`completion: ${JSON.stringify(items[0].insertText.slice(0, 60))}`);
  console.log("1 passed");
  process.exit(0);
})().catch((error) => { console.error(error); process.exit(1); });
