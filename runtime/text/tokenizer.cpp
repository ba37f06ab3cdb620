// Loading tokenizer.json and the encode/decode pipelines (tokenizers/src/tokenizer/mod.rs and
// added_vocabulary.rs are the reference for the order of stages).
#include "runtime/text/tokenizer.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "runtime/core/error.hpp"
#include "runtime/text/json_scan.hpp"
#include "runtime/text/tokenizer_impl.hpp"
#include "runtime/text/utf8.hpp"

namespace scr::text {

using nlohmann::json;

namespace {

std::string read_file(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) scr::fail("cannot open {}", p.string());
    std::string s;
    f.seekg(0, std::ios::end);
    const auto size = f.tellg();
    if (size < 0) scr::fail("cannot read {}", p.string());
    s.resize(static_cast<size_t>(size));
    f.seekg(0);
    f.read(s.data(), size);
    if (!f) scr::fail("cannot read {}", p.string());
    return s;
}

json parse_json(std::string_view text, std::string_view origin, std::string_view path) {
    try {
        return json::parse(text.begin(), text.end());
    } catch (const json::parse_error& e) {
        scr::fail("{}: {}: malformed JSON: {}", origin, path.empty() ? "(root)" : path, e.what());
    }
}

// tokenizer_config.json writes special tokens as "str" or {"content": "str", ...}.
std::optional<std::string> token_string(const json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return std::nullopt;
}

bool is_whitespace_cp(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

bool is_word_cp(char32_t c) {
    if (c == '_') return true;
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

// Code point ending at byte `end` (end > 0).
char32_t last_cp(std::string_view s, size_t end, size_t* start_out = nullptr) {
    size_t k = end - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    if (start_out) *start_out = k;
    size_t j = k;
    return utf8::next(s, j);
}

// Ids index dense tables; real vocabularies stay far below this.
constexpr long long kMaxTokenId = 1 << 24;

// Streams model.vocab and model.merges; every other member of "model" is returned as JSON.
struct ModelSection {
    json rest = json::object();
    std::vector<int32_t> vocab_ids;
    std::string merges_arena;                    // "a" "b" back to back
    std::vector<std::pair<uint32_t, uint32_t>> merge_lens;  // (len a, len b) per merge
    bool has_vocab = false, has_merges = false;
};

void read_vocab(JsonCursor& cur, TokenTable& table, ModelSection& model) {
    static constexpr std::string_view path = "model.vocab";
    cur.expect('{', path);
    model.has_vocab = true;
    std::string key;
    if (cur.consume('}')) return;
    do {
        cur.read_string(key, path);
        cur.expect(':', path);
        const long long id = cur.read_integer(path);
        if (id < 0 || id >= kMaxTokenId) cur.fail(path, fmt::format("id {} of \"{}\" is out of range", id, key));
        table.set(static_cast<int32_t>(id), key);
        model.vocab_ids.push_back(static_cast<int32_t>(id));
    } while (cur.consume(','));
    cur.expect('}', path);
}

void read_merges(JsonCursor& cur, ModelSection& model) {
    static constexpr std::string_view path = "model.merges";
    cur.expect('[', path);
    model.has_merges = true;
    std::string a, b;
    if (cur.consume(']')) return;
    do {
        if (cur.peek() == '"') {
            // Legacy "left right" form.
            cur.read_string(a, path);
            const size_t space = a.find(' ');
            if (space == std::string::npos || space == 0 || space + 1 >= a.size())
                cur.fail(path, fmt::format("merge \"{}\" is not of the form \"left right\"", a));
            model.merges_arena.append(a, 0, space);
            model.merges_arena.append(a, space + 1, std::string::npos);
            model.merge_lens.emplace_back(static_cast<uint32_t>(space), static_cast<uint32_t>(a.size() - space - 1));
        } else {
            cur.expect('[', path);
            cur.read_string(a, path);
            cur.expect(',', path);
            cur.read_string(b, path);
            cur.expect(']', path);
            model.merges_arena += a;
            model.merges_arena += b;
            model.merge_lens.emplace_back(static_cast<uint32_t>(a.size()), static_cast<uint32_t>(b.size()));
        }
    } while (cur.consume(','));
    cur.expect(']', path);
}

void read_model(JsonCursor& cur, TokenTable& table, ModelSection& model) {
    cur.expect('{', "model");
    std::string key;
    if (cur.consume('}')) return;
    do {
        cur.read_string(key, "model");
        cur.expect(':', "model");
        if (key == "vocab" && cur.peek() == '{') {
            read_vocab(cur, table, model);
        } else if (key == "merges" && cur.peek() == '[') {
            read_merges(cur, model);
        } else {
            const std::string path = "model." + key;
            model.rest[key] = json::parse(cur.skip_value(path), nullptr, false);
            if (model.rest[key].is_discarded()) cur.fail(path, "malformed JSON value");
        }
    } while (cur.consume(','));
    cur.expect('}', "model");
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<TokenizerData> data) : data_(std::move(data)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& path) {
    std::filesystem::path tok_path = path;
    if (std::filesystem::is_directory(path)) tok_path = path / "tokenizer.json";
    if (!std::filesystem::exists(tok_path)) scr::fail("{}: no tokenizer.json found", path.string());
    const auto dir = tok_path.parent_path();
    const std::string text = read_file(tok_path);
    std::string config, gen_config;
    if (std::filesystem::exists(dir / "tokenizer_config.json")) config = read_file(dir / "tokenizer_config.json");
    if (std::filesystem::exists(dir / "generation_config.json")) gen_config = read_file(dir / "generation_config.json");
    return from_json_text(text, config, gen_config, tok_path.string());
}

std::unique_ptr<Tokenizer> Tokenizer::from_json_text(std::string_view text, std::string_view config_text,
                                                     std::string_view gen_config_text, std::string_view origin) {
    auto d = std::make_unique<TokenizerData>();
    JsonCursor cur(text, origin);
    ModelSection model;
    json top = json::object();
    bool has_model = false;
    d->tokens.reserve(160000, text.size() / 4);

    cur.expect('{', "");
    std::string key;
    if (!cur.consume('}')) {
        do {
            cur.read_string(key, "");
            cur.expect(':', key);
            if (key == "model") {
                read_model(cur, d->tokens, model);
                has_model = true;
            } else {
                top[key] = json::parse(cur.skip_value(key), nullptr, false);
                if (top[key].is_discarded()) cur.fail(key, "malformed JSON value");
            }
        } while (cur.consume(','));
        cur.expect('}', "");
    }
    if (!cur.at_end()) cur.fail("", "trailing characters after the top-level object");
    if (!has_model) scr::fail("{}: missing \"model\"", origin);

    auto where = [&](std::string_view path) { return fmt::format("{}: {}", origin, path); };

    // ---- model ----
    const json& m = model.rest;
    if (m.contains("type") && !(m["type"].is_string() && m["type"] == "BPE"))
        scr::fail("{}: model type {} is not supported (only BPE)", where("model.type"), m["type"].dump());
    if (!model.has_vocab) scr::fail("{}: missing or not an object", where("model.vocab"));
    if (!model.has_merges) scr::fail("{}: missing or not an array", where("model.merges"));

    // Added tokens go into the same table before indexing, so that index lookups see them too.
    std::vector<int32_t> all_ids = model.vocab_ids;
    if (top.contains("added_tokens") && !top["added_tokens"].is_null()) {
        const json& list = top["added_tokens"];
        if (!list.is_array()) scr::fail("{}: expected an array", where("added_tokens"));
        for (size_t i = 0; i < list.size(); ++i) {
            const json& t = list[i];
            const std::string at = fmt::format("added_tokens[{}]", i);
            if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
                !t["content"].is_string())
                scr::fail("{}: expected {{\"id\": int, \"content\": string, ...}}", where(at));
            AddedToken a;
            const auto id = t["id"].get<int64_t>();
            if (id < 0 || id >= kMaxTokenId) scr::fail("{}: id {} is out of range", where(at), id);
            a.id = static_cast<int32_t>(id);
            a.content = t["content"].get<std::string>();
            auto flag = [&](const char* k, bool fallback) {
                if (!t.contains(k) || t[k].is_null()) return fallback;
                if (!t[k].is_boolean()) scr::fail("{}.{}: expected true/false", where(at), k);
                return t[k].get<bool>();
            };
            a.special = flag("special", false);
            a.lstrip = flag("lstrip", false);
            a.rstrip = flag("rstrip", false);
            a.single_word = flag("single_word", false);
            a.normalized = flag("normalized", !a.special);
            if (d->tokens.get(a.id) != a.content) d->tokens.set(a.id, a.content);
            all_ids.push_back(a.id);
            d->added.push_back(std::move(a));
        }
    }
    d->index.build(d->tokens, all_ids);
    // Model-vocab strings must map to their model ids even when an added token reuses an id.
    d->vocab_size = static_cast<int>(d->tokens.id_limit());
    d->added_index_by_id.assign(static_cast<size_t>(d->vocab_size), -1);
    for (size_t k = 0; k < d->added.size(); ++k)
        d->added_index_by_id[static_cast<size_t>(d->added[k].id)] = static_cast<int32_t>(k);

    BpeModel& bpe = d->bpe;
    bpe.vocab = &d->index;
    auto opt_string = [&](const char* k) -> std::string {
        if (!m.contains(k) || m[k].is_null()) return {};
        if (!m[k].is_string()) scr::fail("{}: expected a string", where(std::string("model.") + k));
        return m[k].get<std::string>();
    };
    auto opt_bool = [&](const char* k) {
        if (!m.contains(k) || m[k].is_null()) return false;
        if (!m[k].is_boolean()) scr::fail("{}: expected true/false", where(std::string("model.") + k));
        return m[k].get<bool>();
    };
    if (const std::string unk = opt_string("unk_token"); !unk.empty()) {
        const int32_t id = d->index.find(unk);
        if (id < 0) scr::fail("{}: unk token \"{}\" is not in the vocabulary", where("model.unk_token"), unk);
        bpe.unk_id = id;
    }
    bpe.fuse_unk = opt_bool("fuse_unk");
    bpe.byte_fallback = opt_bool("byte_fallback");
    bpe.ignore_merges = opt_bool("ignore_merges");
    bpe.continuing_subword_prefix = opt_string("continuing_subword_prefix");
    bpe.end_of_word_suffix = opt_string("end_of_word_suffix");
    for (int b = 0; b < 256; ++b) bpe.byte_token_ids[b] = d->index.find(fmt::format("<0x{:02X}>", b));

    // Resolve merges to (left id, right id) -> (rank, merged id), in batches whose hash-table slots
    // are prefetched first: the lookups are cache misses, and overlapping them halves load time.
    bpe.merges.reserve(model.merge_lens.size());
    {
        constexpr size_t kBatch = 32;
        struct Lookup {
            std::string_view a, b, merged;  // a+b is contiguous in the arena
            size_t ha, hb, hm;
            int32_t ia, ib, im;
        };
        Lookup batch[kBatch];
        size_t off = 0;
        const size_t n = model.merge_lens.size();
        for (size_t base = 0; base < n; base += kBatch) {
            const size_t count = std::min(kBatch, n - base);
            for (size_t k = 0; k < count; ++k) {
                const auto [la, lb] = model.merge_lens[base + k];
                Lookup& l = batch[k];
                l.a = std::string_view(model.merges_arena.data() + off, la);
                l.b = std::string_view(model.merges_arena.data() + off + la, lb);
                l.merged = std::string_view(model.merges_arena.data() + off, la + lb);
                off += la + lb;
                l.ha = TokenIndex::hash(l.a);
                l.hb = TokenIndex::hash(l.b);
                l.hm = TokenIndex::hash(l.merged);
                d->index.prefetch(l.ha);
                d->index.prefetch(l.hb);
                d->index.prefetch(l.hm);
            }
            for (size_t k = 0; k < count; ++k) {
                Lookup& l = batch[k];
                l.ia = d->index.find(l.a, l.ha);
                l.ib = d->index.find(l.b, l.hb);
                l.im = d->index.find(l.merged, l.hm);
                if (l.ia < 0 || l.ib < 0 || l.im < 0) {
                    const std::string_view missing = l.ia < 0 ? l.a : l.ib < 0 ? l.b : l.merged;
                    scr::fail("{}[{}]: token \"{}\" is not in the vocabulary", where("model.merges"), base + k, missing);
                }
                bpe.merges.prefetch(l.ia, l.ib);
            }
            for (size_t k = 0; k < count; ++k)
                bpe.merges.insert(batch[k].ia, batch[k].ib, static_cast<uint32_t>(base + k), batch[k].im);
        }
    }

    // ---- stages ----
    auto stage = [&](const char* k) -> const json& {
        static const json null_json;
        return top.contains(k) ? top[k] : null_json;
    };
    d->normalizer = make_normalizer(stage("normalizer"), where("normalizer"));
    d->pre_tokenizer = make_pre_tokenizer(stage("pre_tokenizer"), where("pre_tokenizer"));
    d->decoder = make_decoder(stage("decoder"), where("decoder"));
    d->decoder_is_plain_byte_level = stage("decoder").is_object() && stage("decoder").value("type", "") == "ByteLevel";
    d->post_processor = make_post_processor(stage("post_processor"), where("post_processor"), d->index, d->tokens);

    // Added-token matchers: normalized tokens are matched against normalized text, so their
    // pattern is normalized too (added_vocabulary.rs, refresh_added_tokens).
    for (size_t k = 0; k < d->added.size(); ++k) {
        const AddedToken& a = d->added[k];
        if (a.normalized) {
            std::string pattern = a.content;
            if (d->normalizer) d->normalizer->normalize(pattern);
            d->normalized_matcher.add(pattern, static_cast<int32_t>(k));
        } else {
            d->raw_matcher.add(a.content, static_cast<int32_t>(k));
        }
    }

    // ---- tokenizer_config.json / generation_config.json ----
    std::string config_origin = "tokenizer_config.json";
    json config = config_text.empty() ? json::object() : parse_json(config_text, config_origin, "");
    if (!config.is_object()) scr::fail("{}: expected an object", config_origin);
    for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
        if (!config.contains(name)) continue;
        if (auto s = token_string(config[name])) d->special_strings[name] = *s;
    }
    auto id_of = [&](const char* name) -> std::optional<int32_t> {
        if (!d->special_strings.contains(name)) return std::nullopt;
        const int32_t id = d->index.find(d->special_strings[name].get<std::string>());
        return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
    };
    d->bos = id_of("bos_token");
    d->eos = id_of("eos_token");
    if (!d->bos && d->post_processor) {
        if (auto p = d->post_processor->prefix_ids(); !p.empty()) d->bos = p.front();
    }
    auto add_eot = [&](int32_t id) {
        if (std::find(d->end_of_turn.begin(), d->end_of_turn.end(), id) == d->end_of_turn.end())
            d->end_of_turn.push_back(id);
    };
    if (d->eos) add_eot(*d->eos);
    if (!gen_config_text.empty()) {
        const json g = parse_json(gen_config_text, "generation_config.json", "");
        if (g.is_object() && g.contains("eos_token_id")) {
            const json& e = g["eos_token_id"];
            if (e.is_number_integer()) add_eot(e.get<int32_t>());
            else if (e.is_array())
                for (const auto& v : e)
                    if (v.is_number_integer()) add_eot(v.get<int32_t>());
        }
    }
    for (const char* marker : {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>"}) {
        const int32_t id = d->index.find(marker);
        if (id >= 0 && d->is_special(id)) add_eot(id);
    }
    return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(d)));
}

// ---- encode -------------------------------------------------------------------------------------

namespace {

// added_vocabulary.rs find_matches: splits `s` around added tokens, applying single_word, lstrip
// and rstrip. Calls on_text(text, starts_at_origin) and on_token(id) in order.
template <typename OnText, typename OnToken>
void split_on_added(const TokenizerData& d, const AddedTokenMatcher& matcher, std::string_view s, bool at_origin,
                    OnText&& on_text, OnToken&& on_token) {
    if (matcher.empty()) {
        if (!s.empty()) on_text(s, at_origin);
        return;
    }
    size_t emitted = 0;  // start of the not-yet-emitted text
    size_t search = 0;
    while (search < s.size()) {
        const auto m = matcher.find(s, search);
        if (m.token < 0) break;
        const AddedToken& tok = d.added[static_cast<size_t>(m.token)];
        size_t start = m.start, stop = m.end;
        search = m.end;
        if (tok.single_word) {
            const bool start_ok = start == 0 || !is_word_cp(last_cp(s, start));
            bool stop_ok = stop == s.size();
            if (!stop_ok) {
                size_t j = stop;
                stop_ok = !is_word_cp(utf8::next(s, j));
            }
            if (!start_ok || !stop_ok) {
                search = m.start + utf8::seq_len(static_cast<unsigned char>(s[m.start]));
                continue;
            }
        }
        if (tok.lstrip) {
            size_t k = start;
            while (k > emitted) {
                size_t cs;
                if (!is_whitespace_cp(last_cp(s, k, &cs))) break;
                k = cs;
            }
            start = std::max(k, emitted);
        }
        if (tok.rstrip) {
            while (stop < s.size()) {
                size_t j = stop;
                if (!is_whitespace_cp(utf8::next(s, j))) break;
                stop = j;
            }
            search = stop;
        }
        if (emitted < start) on_text(s.substr(emitted, start - emitted), at_origin && emitted == 0);
        on_token(tok.id);
        emitted = stop;
    }
    if (emitted < s.size()) on_text(s.substr(emitted), at_origin && emitted == 0);
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
    const TokenizerData& d = *data_;
    std::string sanitized;
    if (!utf8::is_valid(text)) {
        sanitized = utf8::lossy(text);
        text = sanitized;
    }
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    thread_local std::vector<Piece> pieces;
    std::string normalized;

    auto on_token = [&](int32_t id) { ids.push_back(id); };
    auto model_text = [&](std::string_view s, bool at_origin) {
        pieces.clear();
        pieces.push_back(Piece{std::string(s), at_origin});
        if (d.pre_tokenizer) d.pre_tokenizer->pre_tokenize(pieces);
        for (const auto& p : pieces) d.bpe.tokenize(p.text, ids);
    };
    auto raw_text = [&](std::string_view s, bool at_origin) {
        if (!d.normalizer) {
            split_on_added(d, d.normalized_matcher, s, at_origin, model_text, on_token);
            return;
        }
        normalized.assign(s);
        d.normalizer->normalize(normalized);
        const std::string local = std::move(normalized);
        split_on_added(d, d.normalized_matcher, local, at_origin, model_text, on_token);
    };
    split_on_added(d, d.raw_matcher, text, true, raw_text, on_token);
    if (add_special_tokens && d.post_processor) d.post_processor->process(ids);
    return ids;
}

// ---- decode -------------------------------------------------------------------------------------

void Tokenizer::decode_append(std::span<const int32_t> ids, bool skip_special_tokens, std::string& out) const {
    const TokenizerData& d = *data_;
    auto keep = [&](int32_t id) { return d.tokens.has(id) && !(skip_special_tokens && d.is_special(id)); };
    if (d.decoder_is_plain_byte_level) {
        // Fast path, same result as ByteLevelDecoder::decode_chain: no per-token strings.
        const ByteLevelMap& map = byte_level_map();
        thread_local std::string bytes;
        bytes.clear();
        for (int32_t id : ids) {
            if (!keep(id)) continue;
            map.append_decoded(bytes, d.tokens.get(id));
        }
        utf8::append_lossy(out, bytes);
        return;
    }
    thread_local std::vector<std::string> tokens;
    tokens.clear();
    for (int32_t id : ids)
        if (keep(id)) tokens.emplace_back(d.tokens.get(id));
    const size_t start = out.size();
    if (d.decoder) {
        d.decoder->decode_chain(tokens);
        for (const auto& t : tokens) out += t;
    } else {
        for (size_t k = 0; k < tokens.size(); ++k) {
            if (k) out.push_back(' ');
            out += tokens[k];
        }
    }
    if (!utf8::is_valid(std::string_view(out).substr(start))) {
        const std::string tail = utf8::lossy(std::string_view(out).substr(start));
        out.resize(start);
        out += tail;
    }
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
    std::string out;
    decode_append(ids, skip_special_tokens, out);
    return out;
}

int Tokenizer::vocab_size() const { return data_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
    const int32_t id = data_->index.find(token);
    return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
}

std::string_view Tokenizer::id_to_token(int32_t id) const { return data_->tokens.get(id); }
bool Tokenizer::is_special(int32_t id) const { return data_->is_special(id); }
std::optional<int32_t> Tokenizer::bos_id() const { return data_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return data_->eos; }
std::vector<int32_t> Tokenizer::eos_ids() const { return data_->end_of_turn; }

std::optional<std::string> Tokenizer::special_token_string(std::string_view name) const {
    const std::string key(name);
    if (!data_->special_strings.contains(key)) return std::nullopt;
    return data_->special_strings[key].get<std::string>();
}

}  // namespace scr::text
