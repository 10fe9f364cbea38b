//! The server-sent-events reader both stream converters share.
//!
//! Input arrives in arbitrary chunks: an event, a line, even a UTF-8 sequence may be split
//! anywhere. The reader keeps the partial line and the `data:` of the one event being read
//! (nothing more: each event is handed on the moment its blank line arrives) and bounds
//! both, so a provider cannot make a stream hold unbounded memory. It follows the SSE rules
//! the two dialects use: `data:` lines of one event are joined with `\n`, a line starting
//! with `:` is a comment, `event:`/`id:`/`retry:` are read past (both dialects repeat the
//! event's type inside its JSON), lines end with `\n`, `\r\n` or a lone `\r` (a `\r` that ends
//! a chunk leaves the next chunk's leading `\n`, if any, to be skipped). `tests/props.rs`
//! checks it against `sse-stream`, which follows the WHATWG rules, on streams cut at every
//! byte; one difference is deliberate: an event left open when the input ends is handed on by
//! [`SseReader::finish`] (the rules drop it).

use super::BadUpstream;

/// The largest event (its `data:` and its partial line together) held.
pub(super) const MAX_EVENT_BYTES: usize = 16 << 20;

/// One complete item of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseEvent<'a> {
    /// An event's data (its `data:` lines joined).
    Data(&'a [u8]),
    /// A comment line (`: keep-alive`).
    Comment,
}

#[derive(Debug, Default)]
pub struct SseReader {
    /// The line not yet ended.
    line: Vec<u8>,
    /// The data of the event being read.
    data: Vec<u8>,
    /// A `data:` line was read for this event (the data may still be empty).
    has_data: bool,
    /// The last chunk ended with the `\r` that ended a line: a `\n` starting the next one
    /// belongs to it.
    after_cr: bool,
}

const TOO_LARGE: BadUpstream = BadUpstream::Malformed("an event over 16 MiB");

impl SseReader {
    /// Read `chunk`, handing each complete event to `on_event` as soon as it ends.
    pub fn feed<F>(&mut self, mut chunk: &[u8], on_event: &mut F) -> Result<(), BadUpstream>
    where
        F: FnMut(SseEvent<'_>) -> Result<(), BadUpstream>,
    {
        if self.after_cr && !chunk.is_empty() {
            self.after_cr = false;
            chunk = chunk.strip_prefix(b"\n").unwrap_or(chunk);
        }
        while let Some(end) = memchr::memchr2(b'\n', b'\r', chunk) {
            let line = &chunk[..end];
            let cr = chunk[end] == b'\r';
            chunk = &chunk[end + 1..];
            if cr {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            if self.line.is_empty() {
                // The common case: the whole line is in this chunk, no copy.
                self.line_done(line, on_event)?;
            } else {
                let mut whole = std::mem::take(&mut self.line);
                whole.extend_from_slice(line);
                let done = self.line_done(&whole, on_event);
                // Keep the allocation for the next split line.
                whole.clear();
                self.line = whole;
                done?;
            }
        }
        if self.line.len() + chunk.len() + self.data.len() > MAX_EVENT_BYTES {
            return Err(TOO_LARGE);
        }
        self.line.extend_from_slice(chunk);
        Ok(())
    }

    /// The input ended: a last line without its `\n` and an event without its blank line
    /// are complete now.
    pub fn finish<F>(&mut self, on_event: &mut F) -> Result<(), BadUpstream>
    where
        F: FnMut(SseEvent<'_>) -> Result<(), BadUpstream>,
    {
        self.after_cr = false;
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            self.line_done(&line, on_event)?;
        }
        self.line_done(b"", on_event)
    }

    fn line_done<F>(&mut self, line: &[u8], on_event: &mut F) -> Result<(), BadUpstream>
    where
        F: FnMut(SseEvent<'_>) -> Result<(), BadUpstream>,
    {
        if line.is_empty() {
            if !self.has_data {
                return Ok(());
            }
            self.has_data = false;
            let handed = on_event(SseEvent::Data(&self.data));
            self.data.clear();
            return handed;
        }
        if line[0] == b':' {
            return on_event(SseEvent::Comment);
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            if self.data.len() + value.len() + 1 > MAX_EVENT_BYTES {
                return Err(TOO_LARGE);
            }
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(parts: &[&[u8]]) -> Vec<String> {
        let mut reader = SseReader::default();
        let mut seen = Vec::new();
        let mut on = |ev: SseEvent<'_>| {
            seen.push(match ev {
                SseEvent::Data(d) => String::from_utf8_lossy(d).into_owned(),
                SseEvent::Comment => ":".to_string(),
            });
            Ok(())
        };
        for p in parts {
            reader.feed(p, &mut on).expect("feed");
        }
        reader.finish(&mut on).expect("finish");
        seen
    }

    #[test]
    fn events_end_at_blank_lines_whatever_the_split() {
        let whole: &[u8] =
            b"event: a\ndata: {\"x\":1}\n\n: keep-alive\n\ndata: l1\r\ndata:l2\r\n\r\nid: 3\n\ndata: [DONE]\n\n";
        let expected = vec!["{\"x\":1}", ":", "l1\nl2", "[DONE]"];
        assert_eq!(read_all(&[whole]), expected);
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        assert_eq!(read_all(&bytes), expected);
        for cut in 0..whole.len() {
            assert_eq!(
                read_all(&[&whole[..cut], &whole[cut..]]),
                expected,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn an_unterminated_last_event_is_complete_at_the_end() {
        assert_eq!(read_all(&[b"data: [DONE]"]), vec!["[DONE]"]);
        assert_eq!(read_all(&[b"data: {}\n"]), vec!["{}"]);
        assert!(read_all(&[b"event: ping\n"]).is_empty());
    }

    #[test]
    fn an_endless_event_is_refused() {
        let mut reader = SseReader::default();
        let mut on = |_: SseEvent<'_>| Ok(());
        let big = vec![b'x'; 1 << 20];
        reader.feed(b"data: ", &mut on).expect("start");
        let mut failed = false;
        for _ in 0..20 {
            if reader.feed(&big, &mut on).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "a line over the bound is refused");
        let mut reader = SseReader::default();
        let line = [b"data: ", &big[..], b"\n"].concat();
        let mut failed = false;
        for _ in 0..20 {
            if reader.feed(&line, &mut on).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "an event of many lines over the bound is refused");
    }
}
