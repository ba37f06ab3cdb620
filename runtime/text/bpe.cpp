// Token tables, the BPE model and added-token matching.
// The merge loop follows tokenizers/src/models/bpe/word.rs (Word::merge_all): a min-heap of
// candidate pairs ordered by (rank, position) over a linked list of symbols; entries made stale by
// an earlier merge are skipped when popped. Same result as re-scanning for the lowest-rank pair,
// in O(n log n).
#include <algorithm>
#include <cstring>
#include <functional>

#include "runtime/core/error.hpp"
#include "runtime/text/tokenizer_impl.hpp"
#include "runtime/text/utf8.hpp"

namespace scr::text {

// ---- TokenTable / TokenIndex / PairMap ---------------------------------------------------------

void TokenTable::set(int32_t id, std::string_view token) {
    if (id < 0) scr::fail("negative token id {}", id);
    const auto idx = static_cast<size_t>(id);
    if (idx >= spans_.size()) spans_.resize(idx + 1, {0, kAbsent});
    spans_[idx] = {static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(token.size())};
    arena_.append(token);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

void TokenIndex::build(const TokenTable& table, const std::vector<int32_t>& ids) {
    table_ = &table;
    slots_.assign(pow2_at_least(ids.size() + ids.size() / 2 + 16), Slot{0, -1, 0, 0});
    mask_ = slots_.size() - 1;
    // Batches of hashes and prefetches ahead of the inserts, which are cache misses.
    constexpr size_t kBatch = 32;
    for (size_t base = 0; base < ids.size(); base += kBatch) {
        const size_t end = std::min(ids.size(), base + kBatch);
        for (size_t k = base; k < end; ++k) prefetch(hash(table.get(ids[k])));
        for (size_t k = base; k < end; ++k) insert(table.get(ids[k]), ids[k]);
    }
}

int32_t TokenIndex::find(std::string_view token, size_t h) const {
    if (slots_.empty()) return -1;
    const auto tag = static_cast<uint32_t>(h >> 32);
    size_t i = h & mask_;
    while (true) {
        const Slot& slot = slots_[i];
        if (slot.id < 0) return -1;
        if (slot.tag == tag && slot.length == token.size() &&
            std::memcmp(table_->arena() + slot.offset, token.data(), token.size()) == 0)
            return slot.id;
        i = (i + 1) & mask_;
    }
}

void TokenIndex::insert(std::string_view token, int32_t id) {
    const size_t h = hash(token);
    const auto tag = static_cast<uint32_t>(h >> 32);
    size_t i = h & mask_;
    while (true) {
        Slot& slot = slots_[i];
        if (slot.id < 0 || (slot.tag == tag && table_->get(slot.id) == token)) {
            const auto [offset, length] = table_->span(id);
            slot = Slot{tag, id, offset, length};  // a later duplicate wins, as in a JSON object read into a map
            return;
        }
        i = (i + 1) & mask_;
    }
}

void PairMap::reserve(size_t n) {
    slots_.assign(pow2_at_least(n + n / 2 + 16), Entry{kEmpty, 0, 0});
    mask_ = slots_.size() - 1;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(slots_.size()));
    size_ = 0;
}

void PairMap::insert(int32_t left, int32_t right, uint32_t rank, int32_t merged) {
    const uint64_t key = make_key(left, right);
    size_t i = hash(key) & mask_;
    while (true) {
        Entry& e = slots_[i];
        if (e.key == key) return;  // the first (lowest-rank) occurrence of a pair wins
        if (e.key == kEmpty) {
            e = Entry{key, rank, merged};
            ++size_;
            return;
        }
        i = (i + 1) & mask_;
    }
}

// ---- BPE ----------------------------------------------------------------------------------------

namespace {

struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
};

struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t merged;
    // std heap is a max-heap: "greater" puts the lowest (rank, pos) on top.
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    const bool cacheable = word.size() <= kCacheMaxWordBytes;
    if (cacheable) {
        std::shared_lock lock(cache_mutex);
        if (auto it = cache.find(word); it != cache.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    const size_t start = out.size();
    if (ignore_merges) {
        if (const int32_t id = vocab->find(word); id >= 0) {
            out.push_back(id);
        } else {
            merge_word(word, out);
        }
    } else {
        merge_word(word, out);
    }
    if (cacheable) {
        std::unique_lock lock(cache_mutex);
        if (cache.size() < kCacheCapacity)
            cache.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
    }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
    thread_local std::vector<Symbol> symbols;
    thread_local std::vector<Candidate> heap;
    thread_local std::string piece;
    symbols.clear();
    heap.clear();

    const bool plain = continuing_subword_prefix.empty() && end_of_word_suffix.empty();
    bool last_was_unk = false;
    for (size_t i = 0; i < word.size();) {
        const size_t start = i;
        i += utf8::seq_len(static_cast<unsigned char>(word[i]));
        if (i > word.size()) i = word.size();
        std::string_view ch = word.substr(start, i - start);
        int32_t id;
        if (plain) {
            id = vocab->find(ch);
        } else {
            piece.clear();
            if (start > 0) piece += continuing_subword_prefix;
            piece += ch;
            if (i == word.size()) piece += end_of_word_suffix;
            id = vocab->find(piece);
        }
        if (id >= 0) {
            symbols.push_back({id, -1, -1, true});
            last_was_unk = false;
            continue;
        }
        if (byte_fallback) {
            bool all = true;
            for (unsigned char b : ch) all = all && byte_token_ids[b] >= 0;
            if (all) {
                for (unsigned char b : ch) symbols.push_back({byte_token_ids[b], -1, -1, true});
                last_was_unk = false;
                continue;
            }
        }
        if (unk_id) {
            if (!(fuse_unk && last_was_unk)) symbols.push_back({*unk_id, -1, -1, true});
            last_was_unk = true;
        }
        // No unk token: the character is dropped, as tokenizers does.
    }
    const auto n = static_cast<int32_t>(symbols.size());
    for (int32_t k = 0; k < n; ++k) {
        symbols[static_cast<size_t>(k)].prev = k - 1;
        symbols[static_cast<size_t>(k)].next = (k + 1 < n) ? k + 1 : -1;
    }
    auto push_candidate = [&](int32_t pos) {
        const Symbol& s = symbols[static_cast<size_t>(pos)];
        if (s.next < 0) return;
        if (const PairMap::Entry* e = merges.find(s.id, symbols[static_cast<size_t>(s.next)].id)) {
            heap.push_back({e->rank, pos, e->merged});
            std::push_heap(heap.begin(), heap.end());
        }
    };
    for (int32_t k = 0; k + 1 < n; ++k) push_candidate(k);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end());
        const Candidate top = heap.back();
        heap.pop_back();
        Symbol& left = symbols[static_cast<size_t>(top.pos)];
        if (!left.alive || left.next < 0) continue;
        Symbol& right = symbols[static_cast<size_t>(left.next)];
        const PairMap::Entry* e = merges.find(left.id, right.id);
        if (e == nullptr || e->merged != top.merged || e->rank != top.rank) continue;  // stale
        left.id = top.merged;
        right.alive = false;
        left.next = right.next;
        if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
        if (left.prev >= 0) push_candidate(left.prev);
        push_candidate(top.pos);
    }
    for (int32_t k = 0; k >= 0 && k < n; k = symbols[static_cast<size_t>(k)].next)
        out.push_back(symbols[static_cast<size_t>(k)].id);
}

// ---- Added tokens -------------------------------------------------------------------------------

void AddedTokenMatcher::add(std::string_view pattern, int32_t token_index) {
    if (pattern.empty()) return;
    uint32_t node = 0;
    for (unsigned char c : pattern) {
        auto& children = nodes_[node].children;
        auto it = std::find_if(children.begin(), children.end(), [&](const auto& p) { return p.first == c; });
        if (it != children.end()) {
            node = it->second;
        } else {
            const auto next = static_cast<uint32_t>(nodes_.size());
            nodes_[node].children.emplace_back(c, next);
            nodes_.emplace_back();
            node = next;
        }
    }
    // The first token registered for a string keeps it.
    if (nodes_[node].token < 0) nodes_[node].token = token_index;
    first_byte_[static_cast<unsigned char>(pattern[0])] = true;
}

AddedTokenMatcher::Match AddedTokenMatcher::find(std::string_view s, size_t from) const {
    for (size_t pos = from; pos < s.size(); ++pos) {
        if (!first_byte_[static_cast<unsigned char>(s[pos])]) continue;
        uint32_t node = 0;
        size_t best_end = 0;
        int32_t best = -1;
        for (size_t k = pos; k < s.size(); ++k) {
            const auto c = static_cast<unsigned char>(s[k]);
            const auto& children = nodes_[node].children;
            auto it = std::find_if(children.begin(), children.end(), [&](const auto& p) { return p.first == c; });
            if (it == children.end()) break;
            node = it->second;
            if (nodes_[node].token >= 0) {
                best = nodes_[node].token;
                best_end = k + 1;
            }
        }
        if (best >= 0) return {pos, best_end, best};
    }
    return {std::string_view::npos, std::string_view::npos, -1};
}

}  // namespace scr::text
