// The page's translator in a Web Worker: ONNX Runtime Web, the tokenizers and the search run
// here, so the page's own thread only draws and stays responsive while a sentence is searched
// (a session run and the search between runs never yield to the page's events).
//
// Messages (structured clones), page -> worker:
//   {type: "load", base, numThreads}   base: the model folder's URL, ending with '/'
//   {type: "translate", id, texts, beamSize, batchSize, tgtLang, stream}
// worker -> page:
//   {type: "ready", config, downloadBytes, threads} | {type: "failed", message}   (after "load")
//   {type: "step", id, text, pieces}   with stream: the words so far after every search step
//   {type: "done", id, results}        Translator.translateBatch's results, one per text
//   {type: "error", id, message}
// Translations run one after another, in the order asked.
import * as ort from "onnxruntime-web/wasm";
import { Translator } from "./translator.js";

/** Answer the page's messages in the worker's global scope `scope`. */
export function serveTranslator(scope) {
  const here = new URL(".", scope.location.href).href;
  ort.env.wasm.wasmPaths = here;  // ort-wasm-simd-threaded.{mjs,wasm} lie beside this module
  let translator = null;
  let queue = Promise.resolve();  // one request at a time: a session runs one step at a time

  async function load({ base, numThreads }) {
    ort.env.wasm.numThreads = numThreads;
    try {
      translator = await Translator.load(ort, base);
      scope.postMessage({ type: "ready", config: translator.config, downloadBytes: translator.downloadBytes,
                          threads: ort.env.wasm.numThreads });
    } catch (e) {
      scope.postMessage({ type: "failed", message: e.message });
    }
  }

  async function translate({ id, texts, beamSize, batchSize, tgtLang, stream }) {
    try {
      const onStep = stream ? ({ text, pieces }) => scope.postMessage({ type: "step", id, text, pieces }) : undefined;
      const results = await translator.translateBatch(texts, { beamSize, batchSize, tgtLang, onStep });
      scope.postMessage({ type: "done", id, results });
    } catch (e) {
      scope.postMessage({ type: "error", id, message: e.message });
    }
  }

  scope.addEventListener("message", ({ data }) => {
    const handler = data.type === "load" ? load : data.type === "translate" ? translate : null;
    if (handler) queue = queue.then(() => handler(data));
  });
}
