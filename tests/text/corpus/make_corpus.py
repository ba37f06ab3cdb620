#!/usr/bin/env python3
"""Writes texts.json: the hard tokenizer corpus (deterministic; rerun to regenerate)."""
import json, random, os

rng = random.Random(1234)
T = []

# Prose and code
T += [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.\n\nHowever little known the feelings or views of such a man may be on his first entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is considered the rightful property of some one or other of their daughters.",
    "I'm sure you'll agree: they've done it, we'd like it, she's here, don't you? O'Reilly's I'M YOU'LL THEY'VE 'tis",
    "Mr. Smith paid $1,234.56 (approx. €1.1k) on 2024-07-26 at 09:30:15 UTC+02:00 — see §3.2, p. 17.",
    "def fib(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\nprint([fib(i) for i in range(10)])\n",
    "#include <vector>\nint main(int argc, char** argv) {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2; // double\n\treturn v.size() > 2 ? 0 : -1;\n}\n",
    "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"San Francisco, CA\", \"unit\": \"celsius\"}}",
    "SELECT u.id, COUNT(*) AS n FROM users u LEFT JOIN orders o ON o.user_id = u.id WHERE u.created_at >= '2023-01-01' GROUP BY u.id HAVING n > 3;",
    "<html><body><div class=\"x\">&amp; &lt;tag&gt; &#x1F600;</div></body></html>",
    "$$\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}$$ and \\(\\alpha_i^{(k)}\\)",
    "| col A | col B |\n|-------|------:|\n| `x`   | **1** |\n\n> quote\n- item\n  - nested\n1. one",
    "https://example.com/path/to/page?query=a%20b&x=1#frag mailto:someone@example.org",
]
# Many scripts
T += [
    "我们今天去公园散步，天气非常好。人工智能正在改变世界。",
    "日本語のテキスト：カタカナとひらがな、そして漢字が混ざっています。東京タワー",
    "한국어 문장입니다. 안녕하세요, 만나서 반갑습니다!",
    "مرحبا بالعالم! هذه جملة باللغة العربية مع أرقام ١٢٣٤٥ و 12345.",
    "שלום עולם, זה טקסט בעברית.",
    "नमस्ते दुनिया! यह हिन्दी में एक वाक्य है। क्षत्रिय ज्ञान",
    "สวัสดีครับ นี่คือประโยคภาษาไทยที่ไม่มีช่องว่างระหว่างคำ",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε! Ελληνικά κείμενα με τόνους: άέήίόύώ ΐΰ",
    "தமிழ் மொழி ஒரு பழமையான மொழி. ગુજરાતી ਪੰਜਾਬੀ বাংলা ລາວ ខ្មែរ မြန်မာ",
    "Ñandú café naïve résumé façade coöperate Ångström Straße ĳ ﬁ ﬀ",
    "Tiếng Việt có nhiều dấu: Đường phố Hà Nội, người Việt.",
    "ⅠⅡⅢ ① ½ ¾ ² ³ ٣ ๓ 〇 一二三",
]
# Emoji, ZWJ, flags, modifiers, combining marks
T += [
    "😀😃😄 emoji 🎉🎊 🚀",
    "Family: 👨‍👩‍👧‍👦 couple: 👩‍❤️‍💋‍👨 technologist: 🧑🏽‍💻 flag: 🇺🇸🇯🇵🏴‍☠️ 🏳️‍🌈 keycap: 1️⃣ #️⃣",
    "👍👍🏻👍🏼👍🏽👍🏾👍🏿 ✌️ ❤️‍🔥",
    "e\u0301 vs \u00e9, A\u030a vs \u00c5, n\u0303, \u1e9b\u0323, ko\u0308\u0301",
    "Z\u0351\u0352\u0353a\u0354\u0355\u0356l\u0357\u0358\u0359g\u035a\u035b\u035co\u035d\u035e text",
    "\u0915\u094d\u0937 \u0e01\u0e34\u0e4a \u05d1\u05bc\u05b0",
    "\ufb01 \u2126 \u212b \u1e9e \u00b5 \u2160 full-width: \uff21\uff22\uff23\uff11\uff12\uff13",
]
# Numbers of every length
digits = "31415926535897932384626433832795028841971"
T += [digits[:k] for k in range(1, 22)]
T += ["1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
      "-42 +7 3.14159 2.5e-10 0x1F 0b1010 1e6 1,000,000 1.000.000,00 007 00000",
      "version 1.2.3-rc.4+build.567, ids 9007199254740993, ratio 16:9, 10%",
      "٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ ໐໑໒"]
# Whitespace runs
T += [" " * k + "x" for k in (1, 2, 3, 4, 7, 16)]
T += ["x" + " " * k for k in (1, 2, 5)]
T += ["a\tb\t\tc\t\t\td", "line1\nline2\n\nline4\n\n\n\nline8", "crlf\r\nline\r\n\r\nend\r", "  \n  \n\t\n \t \n",
      "   leading and trailing   ", "\n\n\n", "\t", " ", "\n", "mixed \u00a0nbsp\u3000ideographic\u2003em\u2009thin\u200bzwsp\u2028ls",
      "word\n\n    indented code\n        deeper\n",
      "end with spaces    ", "tabs\t\t\tafter"]
# Special-token strings inside text
T += [
    "<|begin_of_text|>Hello<|eot_id|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "<think>\nreasoning here\n</think>\n\nanswer <tool_call>{\"a\": 1}</tool_call>",
    "<bos><start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n",
    "<s>[INST] hi [/INST] ok</s>",
    "text <s> and </s> and <unk> inside",
    "partial <|im_ and <|eot_id and <start_of and <|endoftext|>x",
    "<|endoftext|><|endoftext|>  <|im_end|>  spaces around  <|im_start|>",
    "[TOOL_CALLS] [AVAILABLE_TOOLS] <pad> <mask> <unused0> <|fim_prefix|>code<|fim_suffix|>",
]
# Invalid-looking and odd code points
T += [
    "\ufffd replacement \ufffd\ufffd",
    "mojibake: Ã©tÃ© Ã¼ber â€œquotesâ€\x9d",
    "escaped bytes \\xff\\xfe\\x00 and %C3%A9 and \\u00e9",
    "ctrl \x00 \x01 \x07 \x1b[31mred\x1b[0m \x7f del",
    "bom \ufeff zero-width \u200b\u200c\u200d joiners \u2060 soft\u00adhyphen",
    "private use \ue000\uf8ff and noncharacter \ufdd0 \uffff plane1 \U0001d400\U0001d7ff \U0010fffd",
    "rtl \u202eoverride\u202c \u200fmark\u200e",
]
# Long words and long inputs
T += [
    "a" * 1000,
    "supercalifragilisticexpialidocious" * 20,
    "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(3000)),
    "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "的" * 500,
    "😀" * 300,
    "-" * 200 + "=" * 100 + "_" * 50,
    " ".join(str(rng.randint(0, 10 ** rng.randint(1, 12))) for _ in range(300)),
]
# Random mixtures drawn from the above alphabets
pools = ["abc XYZ", "我们的", "مرحبا", "नमस्ते", "ไทย", "😀👍🏽", " \n\t", "0123456789", "'s'll", "<|im_end|>", "é\u0301", ".,;!?"]
for _ in range(40):
    T.append("".join(rng.choice(pools) for _ in range(rng.randint(1, 30))))
T.append("")

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "texts.json"), "w", encoding="utf-8") as f:
    json.dump(T, f, ensure_ascii=False, indent=0)
    f.write("\n")
print(len(T), "texts")
