"""The VS Code extension compiles, type-checks and packages into a small .vsix: one bundle
(esbuild) holding the extension and its language client, a LICENSE, no question asked."""

from __future__ import annotations

import zipfile

from tests.editors.vsix import package_extension


def test_extension_compiles_and_packages(tmp_path):
    vsix = package_extension(tmp_path / "vscode")
    with zipfile.ZipFile(vsix) as archive:
        names = set(archive.namelist())
        bundle = archive.read("extension/out/extension.js").decode()
    # one bundle (the extension and vscode-languageclient), not hundreds of loose files
    assert {"extension/out/extension.js", "extension/package.json", "extension/LICENSE.txt"} <= names, names
    assert len(names) <= 10, sorted(names)
    assert "LanguageClient" in bundle and 'require("vscode")' in bundle
    assert not any(n.startswith(("extension/node_modules/", "extension/src/")) for n in names)
