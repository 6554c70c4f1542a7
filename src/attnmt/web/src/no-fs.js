// Stands in for Node's 'fs' in the browser bundle (@sctg/sentencepiece-js imports it for its
// file-path loader, which the page never calls).
export function readFileSync() {
  throw new Error("no file system in the browser");
}
export function writeFileSync() {
  throw new Error("no file system in the browser");
}
