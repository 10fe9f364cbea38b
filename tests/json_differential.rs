#![allow(clippy::unwrap_used)]
//! Differential fuzzing of the request scanner against serde_json.
//!
//! The contract: a request body is read as the provider will read it. So either
//! `ChatRequest::parse` refuses the body (the gateway answers 400), or serde_json parses it to
//! an object and agrees on everything routing reads: the decoded `model`, `stream`, the
//! `routing` object, `max_tokens`, the prompt; no wanted key appears twice (serde_json keeps
//! the last duplicate) or under another letter case; and the body sent upstream is the
//! original document with `model` replaced and `routing` removed. The strict scan must also
//! accept exactly the objects serde_json accepts.
//!
//! Bodies are generated (request-shaped objects with escaped key spellings, deep nesting,
//! extreme numbers, every string escape, invalid UTF-8, odd whitespace, trailing bytes) and
//! mutated (byte flips, inserts, deletes and splices over realistic requests).
//! `SIGNALBOX_FUZZ_CASES` sets the cases per property (default 3000).

use std::fmt;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use signalbox::adapters::envelope::RequestBodyError;
use signalbox::adapters::facts::RoutingOverride;
use signalbox::adapters::json;
use signalbox::adapters::openai::ChatRequest;

const WANTED: [&str; 6] = [
    "model",
    "stream",
    "routing",
    "messages",
    "max_tokens",
    "max_completion_tokens",
];

fn config() -> Config {
    let cases = std::env::var("SIGNALBOX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 10_000,
        ..Config::default()
    }
}

/// Every top-level entry in document order, duplicates included: what serde_json's map
/// access yields before a `Value` keeps only the last of each key.
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = m.next_entry::<String, Value>()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Case-insensitive key matching as Go's `encoding/json` does it, for ASCII wanted keys.
fn folds_to(key: &str, want: &str) -> bool {
    let folded: String = key
        .chars()
        .map(|c| match c {
            '\u{17F}' => 's',
            '\u{131}' | '\u{130}' => 'i',
            '\u{212A}' => 'k',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    folded == want
}

/// The property, for one body.
fn check(body: &[u8]) -> Result<(), TestCaseError> {
    let keys: Vec<&[u8]> = WANTED.iter().map(|k| k.as_bytes()).collect();
    // Neither mode may panic, whatever the bytes; the lenient one (responses) accepts at
    // least what the strict one accepts, and finds the same members (it keeps no member list
    // and no case-folded alias: those guard requests only).
    let lenient = json::scan_object_lenient(body, &keys);
    let strict = json::scan_object(body, &keys);
    if let Ok(scan) = &strict {
        let Ok(loose) = lenient.as_ref() else {
            return Err(TestCaseError::fail(format!(
                "lenient refused what strict accepts: {:?}",
                String::from_utf8_lossy(body)
            )));
        };
        for i in 0..keys.len() {
            prop_assert_eq!(loose.get(i), scan.get(i));
        }
        prop_assert_eq!(
            (loose.duplicate, loose.object_start, loose.object_end),
            (scan.duplicate, scan.object_start, scan.object_end)
        );
        prop_assert!(loose.members.is_empty() && loose.alias.is_none());
    }
    let serde = serde_json::from_slice::<Value>(body);
    let serde_object = matches!(&serde, Ok(Value::Object(_)));
    prop_assert_eq!(
        strict.is_ok(),
        serde_object,
        "strict scan and serde_json disagree: {:?}",
        String::from_utf8_lossy(body)
    );
    let parsed = ChatRequest::parse(Bytes::copy_from_slice(body));
    let Ok(req) = parsed else {
        return Ok(());
    };
    let Ok(Value::Object(obj)) = serde else {
        return Err(TestCaseError::fail("accepted a body serde_json refuses"));
    };
    let entries = serde_json::from_slice::<Entries>(body).unwrap().0;
    for want in WANTED {
        let n = entries.iter().filter(|(k, _)| k == want).count();
        prop_assert!(n <= 1, "`{}` accepted {} times", want, n);
        prop_assert!(
            !entries.iter().any(|(k, _)| k != want && folds_to(k, want)),
            "a case variant of `{}` accepted",
            want
        );
    }
    // model
    let Some(Value::String(model)) = obj.get("model") else {
        return Err(TestCaseError::fail("accepted without a string model"));
    };
    prop_assert_eq!(req.model_name().into_owned(), model.clone());
    // stream: absent, null and false are false.
    match obj.get("stream") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => prop_assert!(!req.stream),
        Some(Value::Bool(true)) => prop_assert!(req.stream),
        Some(other) => return Err(TestCaseError::fail(format!("stream {other} accepted"))),
    }
    // routing: null is the default override.
    match obj.get("routing") {
        None => prop_assert!(req.routing.is_none()),
        Some(Value::Null) => prop_assert_eq!(req.routing.clone(), Some(RoutingOverride::default())),
        Some(v) => {
            let expect = serde_json::from_value::<RoutingOverride>(v.clone());
            prop_assert!(expect.is_ok(), "routing {} accepted", v);
            prop_assert_eq!(req.routing.clone(), expect.ok());
        }
    }
    // max_tokens: max_completion_tokens first, plain non-negative integers only.
    let int = |k: &str| obj.get(k).and_then(Value::as_u64);
    prop_assert_eq!(
        req.max_tokens,
        int("max_completion_tokens").or_else(|| int("max_tokens"))
    );
    // The prompt is the `messages` value.
    if let Some(messages) = obj.get("messages") {
        prop_assert_eq!(
            &serde_json::from_slice::<Value>(req.prompt()).unwrap(),
            messages
        );
    }
    // The upstream body: the same document, `model` replaced, `routing` gone.
    let out = req.body_for(b"\"up\"");
    let Ok(Value::Object(sent)) = serde_json::from_slice::<Value>(&out) else {
        return Err(TestCaseError::fail(format!(
            "upstream body is not a JSON object: {:?}",
            String::from_utf8_lossy(&out)
        )));
    };
    let mut expect = obj.clone();
    expect.remove("routing");
    expect.insert("model".into(), Value::String("up".into()));
    prop_assert_eq!(&sent, &expect);
    // And it reads the same through the gateway again.
    let again = ChatRequest::parse(out).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
    prop_assert_eq!(again.model_name().into_owned(), "up");
    prop_assert!(again.routing.is_none());
    prop_assert_eq!(again.stream, req.stream);
    Ok(())
}

// ---- generated bodies ----

fn pick(options: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(options).prop_map(|s| s.as_bytes().to_vec())
}

fn ws() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        40 => Just(Vec::new()),
        20 => pick(&[" ", "\n", "\r\n", "\t", "  \n\t "]),
        // Whitespace other parsers allow and serde_json does not.
        1 => pick(&["\x0c", "\x0b", "\u{a0}", "\u{feff}", "\u{2028}", "\0"]),
    ]
    .boxed()
}

/// A key, as raw bytes between the quotes: the wanted keys in plain, escaped and case-folded
/// spellings, near misses, and random text.
fn key() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        14 => pick(&WANTED),
        12 => pick(&[
            r"mod\u0065l",
            r"\u006dodel",
            r"\u006Dodel",
            r"m\u006Fdel",
            r"m\u006fdel",
            r"\u006D\u006F\u0064\u0065\u006C",
            r"stre\u0061m",
            r"\u0073tream",
            r"r\u006futing",
            r"\u0072outing",
            r"ROUT\u0049NG",
            r"m\u0065ssages",
            r"max\u005ftokens",
            r"max_completion\u005Ftokens",
            r"\/model",
            r"model\/",
            r"mo\/del",
            r"model\u0000",
            r"model\n",
            r"\u0000model",
            r"mod\u0065l\ud83d\ude00",
            r"mod\ud800el",
            r"\udc00model",
            r"mod\u00e9l",
            r"\u017ftream",
            "\u{17f}tream",
            "rout\u{131}ng",
            "max_to\u{212a}ens",
            r"max_to\u212Aens",
            "Model",
            "MODEL",
            "Stream",
            "model ",
            " model",
            "modeL",
        ]),
        8 => "[a-z_]{0,8}".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..6),
    ]
    .boxed()
}

/// A number's text: valid ones at the edges of f64 and u64, and invalid ones.
fn number() -> BoxedStrategy<Vec<u8>> {
    let digits = |n: std::ops::Range<usize>| prop::collection::vec(0u8..10, n);
    prop_oneof![
        8 => any::<i64>().prop_map(|n| n.to_string().into_bytes()),
        4 => any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        2 => any::<f64>().prop_map(|f| format!("{f:e}").replace("inf", "1e999").replace("NaN", "0").into_bytes()),
        3 => (
            prop::bool::ANY,
            digits(1..4),
            prop::option::of(digits(1..20)),
            prop::sample::select(&["e", "E", "e+", "e-", "E-"][..]),
            prop_oneof![6 => 0u32..20, 2 => 280u32..330, 1 => 0u32..100_000],
        )
            .prop_map(|(neg, int, frac, e, exp)| {
                let mut s = String::new();
                if neg {
                    s.push('-');
                }
                let mut int: String = int.iter().map(|d| char::from(b'0' + d)).collect();
                if int.starts_with('0') {
                    int.replace_range(0..1, "1");
                }
                s.push_str(&int);
                if let Some(frac) = frac {
                    s.push('.');
                    s.extend(frac.iter().map(|d| char::from(b'0' + d)));
                }
                s.push_str(e);
                s.push_str(&exp.to_string());
                s.into_bytes()
            }),
        // Many digits: the integer part around the f64 range and past it.
        2 => (prop::bool::ANY, 290usize..330, prop::option::of(digits(1..30)), prop::bool::ANY).prop_map(
            |(neg, n, frac, nines)| {
                let mut s = String::from(if neg { "-" } else { "" });
                s.push('1');
                s.push_str(&(if nines { "9" } else { "7" }).repeat(n - 1));
                if let Some(frac) = frac {
                    s.push('.');
                    s.extend(frac.iter().map(|d| char::from(b'0' + d)));
                }
                s.into_bytes()
            }
        ),
        2 => pick(&[
            "0", "-0", "0.0", "-0.0e0", "1.7976931348623157e308", "1.7976931348623158e308",
            "-1.7976931348623157e308", "2.2250738585072014e-308", "5e-324", "1e-400", "1e400",
            "0e999999999999999999999", "1e999999999999999999999", "18446744073709551615",
            "18446744073709551616", "-9223372036854775808", "-9223372036854775809",
            "0.000000000000000000000000000000000000001e330",
        ]),
        1 => pick(&["01", "-", "1.", ".5", "+1", "1e", "1e+", "-01", "0x10", "NaN", "Infinity", "1_000"]),
    ]
    .boxed()
}

const INVALID_UTF8: &[&[u8]] = &[
    b"\xff",
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b"\xed\xbf\xbf",
    b"\xf4\x90\x80\x80",
    b"\xe2\x82",
    b"\x80",
    b"\xf0\x9f\x98",
    b"\xc3",
];

/// The contents of a string (between the quotes): every escape, surrogates paired and
/// lone, raw control bytes, invalid UTF-8. Mostly valid, so that whole bodies often are.
fn string_body() -> BoxedStrategy<Vec<u8>> {
    let valid = prop_oneof![
        6 => "[ -!#-\\[\\]-~]{0,12}".prop_map(String::into_bytes),
        2 => r#"[\PC&&[^"\\]]{0,4}"#.prop_map(String::into_bytes),
        3 => pick(&[
            r#"\""#, r"\\", r"\/", r"\b", r"\f", r"\n", r"\r", r"\t", r"\u0000", r"\u001f",
            r"\u0041", r"\u00e9", r"\u00E9", r"\uFFFF", r"\ufffe", r"\uD83D\uDE00",
            r"\ud83d\ude00", r"\uDBFF\uDFFF", r"\ud800\udc00", r"\uDbFf\udFfF",
        ]),
        1 => pick(&["\u{7f}", "\u{80}", "\u{10ffff}", "\u{fffd}", "\u{2028}"]),
    ];
    let invalid = prop_oneof![
        3 => pick(&[
            r"\ud800", r"\uDFFF", r"\udc00", r"\ud800\u0041", r"\ud800\ud800\udc00",
            r"\ud800\n", r"\ud800x", r"\ud800\", r"\ud800\u", r"\ud800\udc0", r"\udbff\ue000",
            r"\u12", r"\u12g4", r"\x41", r"\U0041", r"\'", r"\a", r"\", r"\u+041", r"\u 041",
        ]),
        1 => (0u8..0x20).prop_map(|b| vec![b]),
        1 => prop::sample::select(INVALID_UTF8).prop_map(<[u8]>::to_vec),
    ];
    prop_oneof![
        12 => prop::collection::vec(valid.clone(), 0..5),
        1 => (prop::collection::vec(valid, 0..3), invalid).prop_map(|(mut v, bad)| {
            v.push(bad);
            let half = v.len() / 2;
            v.rotate_right(half);
            v
        }),
    ]
    .prop_map(|v| v.concat())
    .boxed()
}

fn quoted(body: Vec<u8>) -> Vec<u8> {
    let mut s = Vec::with_capacity(body.len() + 2);
    s.push(b'"');
    s.extend_from_slice(&body);
    s.push(b'"');
    s
}

fn leaf() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        16 => string_body().prop_map(quoted),
        12 => number(),
        8 => pick(&["true", "false", "null"]),
        1 => pick(&["tru", "nul", "True", "fals", "nulll", "'x'", "\"unterminated", "undefined"]),
    ]
    .boxed()
}

fn join(open: &[u8], items: Vec<Vec<u8>>, close: &[u8], seps: &[Vec<u8>]) -> Vec<u8> {
    let mut out = open.to_vec();
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&seps[i % seps.len()]);
        out.extend_from_slice(&item);
    }
    out.extend_from_slice(close);
    out
}

fn member(key: Vec<u8>, ws: Vec<u8>, value: Vec<u8>) -> Vec<u8> {
    let mut m = quoted(key);
    m.extend_from_slice(&ws);
    m.push(b':');
    m.extend_from_slice(&ws);
    m.extend_from_slice(&value);
    m
}

fn value() -> BoxedStrategy<Vec<u8>> {
    leaf()
        .prop_recursive(4, 48, 5, |inner| {
            prop_oneof![
                (
                    prop::collection::vec(inner.clone(), 0..5),
                    prop::collection::vec(ws(), 1..3)
                )
                    .prop_map(|(items, seps)| join(b"[", items, b"]", &seps)),
                (
                    prop::collection::vec((key(), ws(), inner), 0..5),
                    prop::collection::vec(ws(), 1..3),
                    prop::bool::weighted(0.03),
                )
                    .prop_map(|(members, seps, trailing_comma)| {
                        let items = members
                            .into_iter()
                            .map(|(k, w, v)| member(k, w, v))
                            .collect();
                        let mut o = join(b"{", items, b"}", &seps);
                        if trailing_comma && o.len() > 2 {
                            o.insert(o.len() - 1, b',');
                        }
                        o
                    }),
            ]
        })
        .boxed()
}

/// A leaf inside `n` nested containers: around serde_json's recursion limit.
fn deep() -> BoxedStrategy<Vec<u8>> {
    (
        120usize..132,
        prop::collection::vec(prop::bool::ANY, 1..4),
        leaf(),
    )
        .prop_map(|(n, kinds, leaf)| {
            let mut open = Vec::new();
            let mut close = Vec::new();
            for i in 0..n {
                if kinds[i % kinds.len()] {
                    open.extend_from_slice(b"{\"k\":");
                    close.push(b'}');
                } else {
                    open.push(b'[');
                    close.push(b']');
                }
            }
            close.reverse();
            [open, leaf, close].concat()
        })
        .boxed()
}

fn routing_value() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        3 => (
            prop::option::of(pick(&["\"cheapest\"", "\"latency\"", "\"x\"", "1", "null"])),
            prop::option::of(prop::collection::vec(pick(&["\"a\"", "\"b\"", r#""\u0061""#, "1"]), 0..12)),
            prop::option::of(pick(&["\"strict\"", "null"])),
            prop::option::of(key()),
            prop::bool::ANY,
        )
            .prop_map(|(strategy, providers, policy, extra, dup)| {
                let mut items = Vec::new();
                if let Some(s) = strategy {
                    items.push(member(b"strategy".to_vec(), vec![], s.clone()));
                    if dup {
                        items.push(member(br"str\u0061tegy".to_vec(), vec![], s));
                    }
                }
                if let Some(p) = providers {
                    items.push(member(b"providers".to_vec(), vec![], join(b"[", p, b"]", &[vec![]])));
                }
                if let Some(p) = policy {
                    items.push(member(b"policy".to_vec(), vec![], p));
                }
                if let Some(k) = extra {
                    items.push(member(k, vec![], b"1".to_vec()));
                }
                join(b"{", items, b"}", &[vec![]])
            }),
        1 => Just(b"null".to_vec()),
        1 => value(),
    ]
    .boxed()
}

/// A value shaped for the key it goes with, often; anything, sometimes.
fn value_for(key: &[u8]) -> BoxedStrategy<Vec<u8>> {
    let decoded = serde_json::from_slice::<String>(&quoted(key.to_vec())).unwrap_or_default();
    let typed: BoxedStrategy<Vec<u8>> = match decoded.to_ascii_lowercase().as_str() {
        "model" => prop_oneof![
            pick(&[
                "\"fast\"",
                "\"gpt-4-expensive\"",
                r#""f\u0061st""#,
                "\"\"",
                "null",
                "1"
            ]),
            string_body().prop_map(quoted),
        ]
        .boxed(),
        "stream" => pick(&["true", "false", "null", "\"true\"", "1", "0", "[]"]).boxed(),
        "routing" => routing_value(),
        "messages" => prop::collection::vec(
            (
                string_body(),
                pick(&["\"user\"", "\"system\"", r#""\u0075ser""#]),
            ),
            0..4,
        )
        .prop_map(|msgs| {
            let items = msgs
                .into_iter()
                .map(|(c, role)| {
                    join(
                        b"{",
                        vec![
                            member(b"role".to_vec(), vec![], role),
                            member(b"content".to_vec(), vec![], quoted(c)),
                        ],
                        b"}",
                        &[vec![]],
                    )
                })
                .collect();
            join(b"[", items, b"]", &[vec![]])
        })
        .boxed(),
        "max_tokens" | "max_completion_tokens" => number(),
        _ => value(),
    };
    prop_oneof![8 => typed, 2 => value(), 1 => deep()].boxed()
}

fn request_body() -> BoxedStrategy<Vec<u8>> {
    let entry = key().prop_flat_map(|k| {
        let v = value_for(&k);
        (Just(k), ws(), v)
    });
    (
        prop_oneof![
            20 => Just(Vec::new()),
            4 => pick(&[" ", "\n"]),
            1 => pick(&["\u{feff}", "\0", "\u{a0}"]),
        ],
        prop::collection::vec(entry, 0..8),
        prop::collection::vec(ws(), 1..4),
        prop::bool::ANY,
        prop_oneof![
            30 => Just(Vec::new()),
            10 => pick(&[" ", "\n", "\r\n\t"]),
            2 => pick(&["x", "}", ",", "{}", "\0", "\u{feff}", " 1", "]", "//", "\u{a0}"]),
        ],
    )
        .prop_map(|(lead, members, seps, with_model, trail)| {
            let mut items: Vec<Vec<u8>> = members
                .into_iter()
                .map(|(k, w, v)| member(k, w, v))
                .collect();
            if with_model && !items.is_empty() {
                // Most requests have a plain model somewhere, so the rest gets exercised.
                items.insert(items.len() / 2, br#""model":"fast""#.to_vec());
            } else if with_model {
                items.push(br#""model":"fast""#.to_vec());
            }
            let mut body = lead;
            body.extend(join(b"{", items, b"}", &seps));
            body.extend(trail);
            body
        })
        .boxed()
}

// ---- mutated bodies ----

const SEEDS: &[&str] = &[
    r#"{"model":"fast","messages":[{"role":"user","content":"Hello! How are you?"}]}"#,
    r#"{"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say \"hi\" in 3 languages\nplease \u00e9\ud83d\ude00"}], "temperature": 0.7, "max_tokens": 256}"#,
    r#"{"model":"fast","routing":{"strategy":"cheapest","providers":["openai","azure"]},"messages":[{"role":"user","content":"x"}],"max_completion_tokens":1024,"stream":false}"#,
    r#"{
  "messages": [
    {"role": "user", "content": [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}
  ],
  "model": "vision",
  "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "number", "minimum": -1e3}}}}}],
  "top_p": 1.0e0,
  "n": 1,
  "stop": null,
  "routing": null
}"#,
    r#"{"mod\u0065l":"fast","r\u006futing":{"providers":["a"]},"messages":[]}"#,
    r#"{"model":"m","user":"\u65e5\u672c","logit_bias":{"50256":-100},"seed":18446744073709551615,"stream":null}"#,
];

#[derive(Debug, Clone)]
enum Mutation {
    Flip(Index, u8),
    Set(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    Splice(Index, usize, Index, Index),
}

fn snippet() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        3 => pick(&[
            "\"", "\\", "{", "}", "[", "]", ",", ":", " ", "\n", "0", "-", "e", "E", ".",
            r"\u0065", r"\u006F", r"\u006f", r"\u0041", r"\ud800", r"\udc00", r"\uD83D\uDE00",
            r#","model":"x""#, r#","mod\u0065l":"gpt-4-expensive""#, r#","MODEL":"y""#,
            r#","stream":true"#, r#","stre\u0061m":true"#, r#","routing":{"providers":["z"]}"#,
            r#","r\u006futing":null"#, r#","messages":[]"#, r#","max_tokens":9"#,
            "1e400", "1e308", "e999", "9999999999999999999999", "true", "null", "\u{feff}",
            "\u{17f}", "\u{212a}",
        ]),
        1 => prop::collection::vec(any::<u8>(), 1..4),
    ]
    .boxed()
}

fn mutation() -> BoxedStrategy<Mutation> {
    prop_oneof![
        3 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        2 => (any::<Index>(), prop_oneof![any::<u8>(), prop::sample::select(&b"\"\\{}[],:u0eE.-+ \n"[..])])
            .prop_map(|(i, b)| Mutation::Set(i, b)),
        4 => (any::<Index>(), snippet()).prop_map(|(i, s)| Mutation::Insert(i, s)),
        2 => (any::<Index>(), 1usize..12).prop_map(|(i, n)| Mutation::Delete(i, n)),
        1 => (any::<Index>(), 1usize..40, any::<Index>(), any::<Index>())
            .prop_map(|(at, n, seed, from)| Mutation::Splice(at, n, seed, from)),
    ]
    .boxed()
}

fn apply(body: &mut Vec<u8>, m: &Mutation) {
    let at = |i: &Index, len: usize| if len == 0 { 0 } else { i.index(len + 1) };
    match m {
        Mutation::Flip(i, b) if !body.is_empty() => {
            let i = i.index(body.len());
            body[i] ^= b;
        }
        Mutation::Set(i, b) if !body.is_empty() => {
            let i = i.index(body.len());
            body[i] = *b;
        }
        Mutation::Insert(i, s) => {
            let i = at(i, body.len());
            body.splice(i..i, s.iter().copied());
        }
        Mutation::Delete(i, n) if !body.is_empty() => {
            let i = i.index(body.len());
            body.drain(i..(i + n).min(body.len()));
        }
        Mutation::Splice(i, n, seed, from) => {
            let seed = SEEDS[seed.index(SEEDS.len())].as_bytes();
            let from = from.index(seed.len());
            let piece = &seed[from..(from + n).min(seed.len())];
            let i = at(i, body.len());
            body.splice(i..i, piece.iter().copied());
        }
        _ => {}
    }
}

fn mutated_body() -> BoxedStrategy<Vec<u8>> {
    (
        any::<Index>(),
        prop_oneof![3 => 1usize..2, 2 => 2usize..4, 1 => 4usize..8]
            .prop_flat_map(|n| prop::collection::vec(mutation(), n)),
    )
        .prop_map(|(seed, mutations)| {
            let mut body = SEEDS[seed.index(SEEDS.len())].as_bytes().to_vec();
            for m in &mutations {
                apply(&mut body, m);
            }
            body
        })
        .boxed()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn generated_bodies_read_as_serde_json_reads_them(body in request_body()) {
        check(&body)?;
    }

    #[test]
    fn mutated_bodies_read_as_serde_json_reads_them(body in mutated_body()) {
        check(&body)?;
    }
}

#[test]
fn seeds_are_accepted_and_agree() {
    for seed in SEEDS {
        check(seed.as_bytes()).unwrap();
        assert!(
            ChatRequest::parse(Bytes::from_static(seed.as_bytes())).is_ok(),
            "{seed}"
        );
    }
}

#[test]
fn regressions() {
    let parse = |b: &[u8]| ChatRequest::parse(Bytes::copy_from_slice(b));
    // An escaped duplicate `model` is the one every JSON parser keeps: refused.
    let smuggled = br#"{"model":"fast","mod\u0065l":"gpt-4-expensive"}"#;
    assert_eq!(
        parse(smuggled).err(),
        Some(RequestBodyError::DuplicateKey("model"))
    );
    // An escaped `model` alone is the model, and the value that gets rewritten.
    let r = parse(br#"{"mod\u0065l":"fast"}"#).unwrap();
    assert_eq!(r.model_name(), "fast");
    assert_eq!(&r.body_for(b"\"up\"")[..], br#"{"mod\u0065l":"up"}"#);
    // An escaped `routing` is applied and stripped.
    let r = parse(br#"{"model":"m","r\u006futing":{"providers":["a"]}}"#).unwrap();
    assert_eq!(
        r.routing.and_then(|r| r.providers),
        Some(vec!["a".to_string()])
    );
    // A case variant is what Go's encoding/json reads: refused.
    assert_eq!(
        parse(br#"{"model":"fast","Model":"gpt-4-expensive"}"#).err(),
        Some(RequestBodyError::KeyCase("model"))
    );
    // What serde_json refuses is refused.
    for body in [
        &br#"{"model":"m","x":"\ud800"}"#[..],
        br#"{"model":"m","x":"\udc00"}"#,
        br#"{"model":"m","x":"\ud800\u0041"}"#,
        br#"{"model":"m","x":1e400}"#,
        b"{\"model\":\"m\",\"x\":\"\xff\"}",
        b"{\"model\":\"m\",\"x\":\"\xed\xa0\x80\"}",
    ] {
        assert_eq!(parse(body).err(), Some(RequestBodyError::NotJson));
    }
    for body in [
        &smuggled[..],
        br#"{"model":"fast","r\u006futing":{"providers":["a"]},"routing":null}"#,
        br#"{"model":"m","x":"\ud800"}"#,
        br#"{"model":"m","x":1.7976931348623158e308}"#,
        br#"{"model":"m","x":1.7976931348623157e308}"#,
    ] {
        check(body).unwrap();
    }
    // Nesting: serde_json's limit, exactly.
    for n in 124..130 {
        let body = format!(r#"{{"model":"m","x":{}{}}}"#, "[".repeat(n), "]".repeat(n));
        check(body.as_bytes()).unwrap();
    }
}
