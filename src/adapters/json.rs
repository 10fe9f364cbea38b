//! A single-pass, allocation-free JSON scanner for the few top-level fields routing needs.
//!
//! The gateway must read `model`, `stream` and `routing` from bodies that are routinely
//! hundreds of KiB, and must rewrite `model` and drop `routing` while keeping every other
//! byte identical. Building a `serde_json::Value` would allocate the whole document and
//! re-serialising it would change bytes, so this scanner validates the full grammar (a body
//! the gateway accepts is JSON) while only recording byte spans of top-level members. The
//! rewrite is then a splice of those spans.
//!
//! Limits: nesting deeper than [`MAX_DEPTH`] is refused; UTF-8 is checked only inside the
//! values the gateway reads (the upstream validates the rest).

use std::ops::Range;

/// Deeper documents are refused: no prompt needs this, and it bounds the recursion.
pub const MAX_DEPTH: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonError {
    /// Not JSON at byte offset.
    Syntax(usize),
    TooDeep,
    /// The document is not an object.
    NotAnObject,
}

/// One member of the top-level object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// From the key's opening quote to the end of the value.
    pub span: Range<usize>,
    /// The key without quotes (raw, escapes not decoded).
    pub key: Range<usize>,
    /// The value, including quotes for strings.
    pub value: Range<usize>,
}

/// Spans of the top-level members the caller asked for, with the member list boundaries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Members whose key matched one of the wanted keys, in document order, with the index
    /// of the wanted key.
    pub found: Vec<(usize, Member)>,
    /// Spans of every top-level member, in order (needed to remove one cleanly).
    pub members: Vec<Range<usize>>,
    /// Offset just after the top-level object's `{`.
    pub object_start: usize,
    /// Offset of the top-level object's `}`.
    pub object_end: usize,
}

impl Scan {
    pub fn get(&self, wanted_index: usize) -> Option<&Member> {
        self.found
            .iter()
            .find(|(w, _)| *w == wanted_index)
            .map(|(_, m)| m)
    }

    /// The byte range to delete to remove the member whose span is `span`, commas included,
    /// so the remaining object is still valid JSON.
    pub fn removal_range(&self, span: &Range<usize>) -> Range<usize> {
        let Some(pos) = self.members.iter().position(|m| m == span) else {
            return span.start..span.start;
        };
        if let Some(next) = self.members.get(pos + 1) {
            // Remove up to the next member's key: takes our comma with us.
            span.start..next.start
        } else if pos > 0 {
            // Last member: remove from the end of the previous member (its trailing comma).
            self.members[pos - 1].end..span.end
        } else {
            span.clone()
        }
    }
}

/// Scan `doc`, which must be a JSON object, recording top-level members whose raw key is one
/// of `wanted`. Every byte is validated.
pub fn scan_object(doc: &[u8], wanted: &[&[u8]]) -> Result<Scan, JsonError> {
    let mut p = Parser { b: doc, i: 0 };
    p.ws();
    if p.peek() != Some(b'{') {
        return if p.i >= doc.len() {
            Err(JsonError::Syntax(p.i))
        } else {
            Err(JsonError::NotAnObject)
        };
    }
    p.i += 1;
    // Sized up front: chat requests and responses have a handful of top-level members, and
    // growing from empty would reallocate twice per scan.
    let mut scan = Scan {
        object_start: p.i,
        found: Vec::with_capacity(wanted.len()),
        members: Vec::with_capacity(8),
        ..Scan::default()
    };
    p.ws();
    if p.peek() == Some(b'}') {
        scan.object_end = p.i;
        p.i += 1;
    } else {
        loop {
            p.ws();
            let member_start = p.i;
            if p.peek() != Some(b'"') {
                return Err(JsonError::Syntax(p.i));
            }
            let key_end = p.string()?;
            let key = member_start + 1..key_end - 1;
            p.ws();
            p.expect(b':')?;
            p.ws();
            let value_start = p.i;
            p.value(1)?;
            let value = value_start..p.i;
            let span = member_start..p.i;
            if let Some(w) = wanted.iter().position(|w| *w == &doc[key.clone()]) {
                scan.found.push((
                    w,
                    Member {
                        span: span.clone(),
                        key,
                        value,
                    },
                ));
            }
            scan.members.push(span);
            p.ws();
            match p.peek() {
                Some(b',') => p.i += 1,
                Some(b'}') => {
                    scan.object_end = p.i;
                    p.i += 1;
                    break;
                }
                _ => return Err(JsonError::Syntax(p.i)),
            }
        }
    }
    p.ws();
    if p.i != doc.len() {
        return Err(JsonError::Syntax(p.i));
    }
    Ok(scan)
}

/// Decode a JSON string literal (with quotes) into text. Borrowed when it has no escapes.
pub fn decode_string(lit: &[u8]) -> Option<std::borrow::Cow<'_, str>> {
    let inner = lit.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if !inner.contains(&b'\\') {
        return std::str::from_utf8(inner)
            .ok()
            .map(std::borrow::Cow::Borrowed);
    }
    // Rare: escapes in a field the gateway reads. serde_json does the decoding.
    serde_json::from_slice::<String>(lit)
        .ok()
        .map(std::borrow::Cow::Owned)
}

/// The offset of the first byte that ends or escapes a JSON string, or is not allowed in one:
/// `"`, `\\` or a control character (< 0x20). Prompts are mostly long strings, and this is
/// most of the scan's cost: `memchr2` finds the next quote or backslash with the widest SIMD
/// the CPU has (AVX2 when present), then one SWAR pass checks the span for control bytes.
#[inline]
fn find_string_special(s: &[u8]) -> Option<usize> {
    // Keys and short values end within a few words: settle them inline, where `memchr2`'s
    // setup would cost more than the scan.
    const SHORT: usize = 32;
    let head = &s[..s.len().min(SHORT)];
    let plain = plain_words(head);
    if let Some(n) = head[plain..]
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
    {
        return Some(plain + n);
    }
    if s.len() <= SHORT {
        return None;
    }
    let rest = &s[SHORT..];
    let end = memchr::memchr2(b'"', b'\\', rest);
    let span = &rest[..end.unwrap_or(rest.len())];
    first_control(span).or(end).map(|n| n + SHORT)
}

/// How many leading bytes of `s` are plain string content, in whole eight-byte words (SWAR:
/// a word is plain when no byte is < 0x20, `"` or `\\`).
#[inline]
fn plain_words(s: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut i = 0;
    while let Some(chunk) = s.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        // Classic "has less than" and "has zero byte" tricks: a special byte is never missed
        // (bytes >= 0x80 can be flagged falsely; the caller's scalar loop settles it).
        let lt = w.wrapping_sub(ONES * 0x20) & !w;
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        let zq = quote.wrapping_sub(ONES) & !quote;
        let zb = backslash.wrapping_sub(ONES) & !backslash;
        if (lt | zq | zb) & HIGHS != 0 {
            break;
        }
        i += 8;
    }
    i
}

/// The offset of the first byte < 0x20. Whole 32-byte blocks are tested with a branch-free
/// fold over a fixed-size array, which the compiler turns into SIMD compares.
#[inline]
fn first_control(s: &[u8]) -> Option<usize> {
    let mut i = 0;
    for chunk in s.chunks_exact(32) {
        let Ok(block) = <&[u8; 32]>::try_from(chunk) else {
            break;
        };
        if block.iter().fold(0u8, |acc, &c| acc | u8::from(c < 0x20)) != 0 {
            break;
        }
        i += 32;
    }
    s[i..].iter().position(|&c| c < 0x20).map(|n| n + i)
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.i += 1;
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), JsonError> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(JsonError::Syntax(self.i))
        }
    }

    /// At a `"`: consume the string; return the offset after the closing quote.
    fn string(&mut self) -> Result<usize, JsonError> {
        self.i += 1;
        loop {
            // Fast skip over ordinary bytes.
            let rest = &self.b[self.i.min(self.b.len())..];
            let n = find_string_special(rest).ok_or(JsonError::Syntax(self.b.len()))?;
            self.i += n;
            match self.b[self.i] {
                b'"' => {
                    self.i += 1;
                    return Ok(self.i);
                }
                b'\\' => {
                    self.i += 1;
                    match self.peek() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                            self.i += 1;
                        }
                        Some(b'u') => {
                            let hex = self
                                .b
                                .get(self.i + 1..self.i + 5)
                                .ok_or(JsonError::Syntax(self.i))?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return Err(JsonError::Syntax(self.i));
                            }
                            self.i += 5;
                        }
                        _ => return Err(JsonError::Syntax(self.i)),
                    }
                }
                _ => return Err(JsonError::Syntax(self.i)),
            }
        }
    }

    fn value(&mut self, depth: usize) -> Result<(), JsonError> {
        match self.peek() {
            Some(b'"') => self.string().map(|_| ()),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(JsonError::Syntax(self.i)),
        }
    }

    fn literal(&mut self, lit: &[u8]) -> Result<(), JsonError> {
        if self.b[self.i..].starts_with(lit) {
            self.i += lit.len();
            Ok(())
        } else {
            Err(JsonError::Syntax(self.i))
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<(), JsonError> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(JsonError::Syntax(self.i)),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(JsonError::Syntax(self.i));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(JsonError::Syntax(self.i));
            }
        }
        Ok(())
    }

    fn object(&mut self, depth: usize) -> Result<(), JsonError> {
        if depth > MAX_DEPTH {
            return Err(JsonError::TooDeep);
        }
        self.i += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(JsonError::Syntax(self.i));
            }
            self.string()?;
            self.ws();
            self.expect(b':')?;
            self.ws();
            self.value(depth)?;
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(JsonError::Syntax(self.i)),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<(), JsonError> {
        if depth > MAX_DEPTH {
            return Err(JsonError::TooDeep);
        }
        self.i += 1;
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.ws();
            self.value(depth)?;
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(JsonError::Syntax(self.i)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(s: &str) -> bool {
        let ok = scan_object(s.as_bytes(), &[]).is_ok();
        let serde_ok =
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(s).is_ok();
        assert_eq!(ok, serde_ok, "scanner and serde_json disagree on {s:?}");
        ok
    }

    #[test]
    fn agrees_with_serde_json() {
        for s in [
            r#"{}"#,
            r#" { "a" : 1 } "#,
            r#"{"a":[1,2,{"b":null}],"c":"x\"y\\z\u00e9","d":-0.5e+10,"e":true,"f":false}"#,
            r#"{"a":"é日本"}"#,
            r#"{"a":1,}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":[1,,2]}"#,
            r#"{"a":tru}"#,
            r#"{"a":"\x"}"#,
            r#"{"a":"\u12g4"}"#,
            "{\"a\":\"tab\there\"}",
            r#"{"a":1} x"#,
            r#"{"a" 1}"#,
            r#"{a:1}"#,
            r#"{"a":1"#,
            r#""#,
        ] {
            valid(s);
        }
    }

    #[test]
    fn not_an_object() {
        assert_eq!(scan_object(b"[1]", &[]), Err(JsonError::NotAnObject));
        assert!(matches!(scan_object(b"", &[]), Err(JsonError::Syntax(_))));
    }

    #[test]
    fn depth_is_bounded() {
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(scan_object(deep.as_bytes(), &[]), Err(JsonError::TooDeep));
        let ok = format!("{{\"a\":{}{}}}", "[".repeat(100), "]".repeat(100));
        assert!(scan_object(ok.as_bytes(), &[]).is_ok());
    }

    #[test]
    fn finds_top_level_members_only() {
        let doc = br#"{"messages":[{"model":"inner"}],"model":"gpt","stream":true}"#;
        let s = scan_object(doc, &[b"model", b"stream"]).expect("valid");
        let m = s.get(0).expect("model");
        assert_eq!(&doc[m.value.clone()], b"\"gpt\"");
        assert_eq!(&doc[s.get(1).expect("stream").value.clone()], b"true");
        assert_eq!(s.members.len(), 3);
    }

    #[test]
    fn removal_keeps_valid_json() {
        for (doc, expect) in [
            (r#"{"routing":{"a":1},"model":"m"}"#, r#"{"model":"m"}"#),
            (r#"{"model":"m", "routing":{"a":1}}"#, r#"{"model":"m"}"#),
            (
                r#"{"model":"m","routing":[],"x":1}"#,
                r#"{"model":"m","x":1}"#,
            ),
            (r#"{"routing":null}"#, r#"{}"#),
        ] {
            let s = scan_object(doc.as_bytes(), &[b"routing"]).expect("valid");
            let r = s.removal_range(&s.get(0).expect("routing").span);
            let mut out = doc.as_bytes().to_vec();
            out.drain(r);
            assert_eq!(std::str::from_utf8(&out).expect("utf8"), expect);
            assert!(serde_json::from_slice::<serde_json::Value>(&out).is_ok());
        }
    }

    #[test]
    fn string_special_scan_matches_the_scalar_rule() {
        let scalar = |s: &[u8]| s.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20);
        let mut cases: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"plain text without specials at all....".to_vec(),
            "non-ascii é 日本語 text that goes on\"".as_bytes().to_vec(),
        ];
        for special in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
            for pos in 0..40 {
                let mut v = vec![b'a'; 44];
                v[pos] = special;
                cases.push(v);
            }
        }
        // A control byte before the quote wins; one after it does not matter.
        cases.push(b"some text\x01 then a quote\" and more".to_vec());
        cases.push(b"some text then a quote\" and a control byte\x01".to_vec());
        cases.push(b"a long run of plain text with a backslash near the end\\n".to_vec());
        // Bytes just around the thresholds must not be flagged.
        cases.push(vec![
            0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xff, 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f,
            0x80, 0xff,
        ]);
        for c in &cases {
            assert_eq!(find_string_special(c), scalar(c), "{c:?}");
        }
    }

    #[test]
    fn decodes_strings() {
        assert_eq!(decode_string(br#""abc""#).as_deref(), Some("abc"));
        assert_eq!(decode_string(br#""a\u0062c""#).as_deref(), Some("abc"));
        assert_eq!(decode_string(b"12"), None);
    }
}
