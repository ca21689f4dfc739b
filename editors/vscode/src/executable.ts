// Where a command lives, looked up as the OS would spawn it: so that a missing codespec
// gets one clear message (with a way to the setting) instead of a spawn error.
import { constants, promises as fs } from "fs";
import * as path from "path";

async function runnable(file: string): Promise<boolean> {
  try {
    const stat = await fs.stat(file);
    if (!stat.isFile()) {
      return false;
    }
    await fs.access(file, process.platform === "win32" ? constants.F_OK : constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** The full path of `command` (a path, or a name on PATH), or undefined when none runs. */
export async function findExecutable(command: string): Promise<string | undefined> {
  const name = command.trim();
  if (!name) {
    return undefined;
  }
  const extensions = process.platform === "win32"
    ? ["", ...(process.env.PATHEXT ?? ".EXE;.CMD;.BAT").split(";")]
    : [""];
  const expanded = name.startsWith("~/") ? path.join(process.env.HOME ?? "", name.slice(2)) : name;
  const places = expanded.includes("/") || expanded.includes("\\")
    ? [expanded]
    : (process.env.PATH ?? "").split(path.delimiter).filter(Boolean).map((dir) => path.join(dir, expanded));
  for (const place of places) {
    for (const extension of extensions) {
      if (await runnable(place + extension)) {
        return place + extension;
      }
    }
  }
  return undefined;
}
