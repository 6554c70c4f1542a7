// Bundle the page's module with esbuild into dist/ (what `attnmt export web` copies into a site):
// dist/index.html, dist/attnmt.js (the page, ONNX Runtime Web's API and SentencePiece compiled to
// WebAssembly), and ONNX Runtime's WebAssembly backend, ort-wasm-simd-threaded.{mjs,wasm}, which
// the module loads from its own folder at run time. Last, dist/SOURCES.sha256: the SHA-256 of each
// file the bundle is built from, in sha256sum's format, which `attnmt export web` compares with the
// sources to refuse a stale bundle (attnmt/interop/web_bundle.py defines the same list).
import { build } from "esbuild";
import { createHash } from "node:crypto";
import { copyFileSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(fileURLToPath(import.meta.url));
const dist = join(root, "dist");
rmSync(dist, { recursive: true, force: true });
mkdirSync(dist);
await build({
  entryPoints: [join(root, "src", "page.js")],
  outfile: join(dist, "attnmt.js"),
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  minify: true,
  legalComments: "linked",
  // onnxruntime-web's build whose WebAssembly glue stays a separate file (loaded from wasmPaths).
  conditions: ["onnxruntime-web-use-extern-wasm"],
  // @sctg/sentencepiece-js reads files with 'fs' only in Node; the page gives it bytes.
  alias: { fs: join(root, "src", "no-fs.js") },
  // Emscripten's glue imports 'module' only when it runs under Node.
  external: ["module"],
  logLevel: "warning",
});
const ortDist = join(root, "node_modules", "onnxruntime-web", "dist");
for (const name of ["ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm"]) {
  copyFileSync(join(ortDist, name), join(dist, name));
}
copyFileSync(join(root, "index.html"), join(dist, "index.html"));

function filesUnder(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? filesUnder(join(dir, e.name)) : e.isFile() ? [join(dir, e.name)] : []);
}
const sources = ["build.mjs", "index.html", "package.json", "package-lock.json"].map((name) => join(root, name))
  .concat(filesUnder(join(root, "src")))
  .map((path) => relative(root, path).split(sep).join("/"))
  .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
const record = sources.map((path) =>
  `${createHash("sha256").update(readFileSync(join(root, path))).digest("hex")}  ${path}\n`);
writeFileSync(join(dist, "SOURCES.sha256"), record.join(""));
