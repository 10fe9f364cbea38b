//! What the mock does with one provider call: every [`Behaviour`], written once over
//! [`Surface`], so that each misbehaviour exists in every dialect.
//!
//! A stream is a sequence of beats: the opening events and the first content event, each
//! further content event, then the finishing events; the stream shape's gap separates beats.
//! Behaviours cut that sequence (after `k` content events), stretch it (a stall before the
//! first beat or after the `k`-th) or replace its end (an in-band error, nothing, a reset).

use std::io;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::surface::{self, Ctx, Frames, Surface};
use super::tls::MockIo;
use super::wire::{self, DateCache, Head};
use super::{Behaviour, Endpoint, StreamShape};

pub(super) const JSON: &[u8] = b"application/json";
pub(super) const SSE: &[u8] = b"text/event-stream";

/// How a connection ends (or goes on) after a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    /// Serve the next request (unless the request asked to close).
    KeepAlive,
    /// Close cleanly: FIN (close_notify first under TLS).
    Close,
    /// Reset: SO_LINGER 0, then drop.
    Reset,
    /// Never answer; wait until the client goes away.
    Hang,
    /// Just drop the connection (client gone, I/O error).
    Drop,
}

/// Response writer with reusable buffers.
pub(super) struct Writer {
    /// Bytes about to be written.
    pub(super) out: Vec<u8>,
    /// A body or an event being built.
    pub(super) ev: Vec<u8>,
    pub(super) date: DateCache,
}

/// Header fields of a response whose body is `Writer::ev`.
pub(super) struct Meta<'a> {
    pub(super) code: u16,
    pub(super) content_type: &'a [u8],
    pub(super) close: bool,
    pub(super) retry_after: Option<&'a [u8]>,
    pub(super) name: &'a [u8],
}

impl Writer {
    pub(super) fn new() -> Writer {
        Writer {
            out: Vec::with_capacity(4096),
            ev: Vec::with_capacity(1024),
            date: DateCache::new(),
        }
    }

    pub(super) fn head(&mut self, m: &Meta<'_>, content_length: Option<usize>, sse: bool) {
        let date = self.date.get();
        wire::write_head(
            &mut self.out,
            &Head {
                code: m.code,
                content_type: m.content_type,
                content_length,
                sse,
                name: m.name,
                date,
                close: m.close,
                retry_after: m.retry_after,
            },
        );
    }

    /// Send a complete response whose body is `self.ev`, in one write.
    pub(super) async fn send<S: MockIo>(&mut self, io: &mut S, m: &Meta<'_>) -> io::Result<()> {
        self.out.clear();
        self.head(m, Some(self.ev.len()), false);
        if !wire::bodyless(m.code) {
            self.out.extend_from_slice(&self.ev);
        }
        io.write_all(&self.out).await?;
        io.flush().await
    }

    /// Send `self.out` and clear it.
    async fn flush_out<S: MockIo>(&mut self, io: &mut S) -> io::Result<()> {
        io.write_all(&self.out).await?;
        io.flush().await?;
        self.out.clear();
        Ok(())
    }

    /// Events appended to `self.out`.
    fn frames(&mut self) -> Frames<'_> {
        Frames::new(&mut self.out, &mut self.ev)
    }
}

/// The request facts a behaviour needs besides the answer itself.
pub(super) struct Call<'a> {
    pub(super) endpoint: Endpoint,
    /// The request asked for a stream.
    pub(super) stream: bool,
    /// The request asked to close the connection.
    pub(super) close: bool,
    /// The credential the request carried (echoed by `Status`'s default body).
    pub(super) credential: &'a [u8],
    pub(super) host: &'a [u8],
    /// `x-mock-name`.
    pub(super) name: &'a [u8],
    /// The configured stream shape.
    pub(super) shape: StreamShape,
}

fn build<'a>(endpoint: Endpoint, cx: Ctx<'a>) -> Box<dyn Surface + Send + 'a> {
    match endpoint {
        Endpoint::ChatCompletions => Box::new(surface::Chat::new(cx)),
        Endpoint::Completions => Box::new(surface::Completions::new(cx)),
        Endpoint::Embeddings => Box::new(surface::Embeddings::new(cx)),
        Endpoint::Responses => Box::new(surface::Responses::new(cx)),
        Endpoint::Messages => Box::new(surface::Messages::new(cx)),
        Endpoint::CountTokens => Box::new(surface::CountTokens::new(cx)),
        Endpoint::Moderations => Box::new(surface::Moderations::new(cx)),
    }
}

pub(super) async fn act<S: MockIo>(
    io: &mut S,
    w: &mut Writer,
    call: &Call<'_>,
    mut cx: Ctx<'_>,
    behaviour: &Behaviour,
) -> io::Result<End> {
    let mut shape = call.shape;
    match behaviour {
        Behaviour::Hang => return Ok(End::Hang),
        Behaviour::Reset => return Ok(End::Reset),
        Behaviour::Close => return Ok(End::Close),
        Behaviour::Status {
            code,
            retry_after,
            body,
        } => {
            w.ev.clear();
            match body {
                Some(body) => w.ev.extend_from_slice(body.as_bytes()),
                None => surface::status_body(
                    call.endpoint.dialect(),
                    &mut w.ev,
                    *code,
                    call.credential,
                    call.host,
                ),
            }
            let meta = Meta {
                code: *code,
                content_type: JSON,
                close: call.close,
                retry_after: retry_after.as_deref().map(str::as_bytes),
                name: call.name,
            };
            w.send(io, &meta).await?;
            return Ok(End::KeepAlive);
        }
        Behaviour::Replay {
            code,
            body,
            sse,
            retry_after,
        } => {
            let meta = Meta {
                code: *code,
                content_type: if *sse { SSE } else { JSON },
                close: call.close,
                retry_after: retry_after.as_deref().map(str::as_bytes),
                name: call.name,
            };
            if !*sse {
                w.ev.clear();
                w.ev.extend_from_slice(body.as_bytes());
                w.send(io, &meta).await?;
                return Ok(End::KeepAlive);
            }
            w.out.clear();
            w.head(&meta, None, true);
            w.flush_out(io).await?;
            let mut rest = body.as_bytes();
            while !rest.is_empty() {
                let end = rest
                    .windows(2)
                    .position(|w| w == b"\n\n")
                    .map_or(rest.len(), |i| i + 2);
                let (event, tail) = rest.split_at(end);
                wire::push_chunk(&mut w.out, event);
                w.flush_out(io).await?;
                rest = tail;
            }
            w.out.extend_from_slice(wire::LAST_CHUNK);
            w.flush_out(io).await?;
            return Ok(End::KeepAlive);
        }
        Behaviour::EmptyStream => {
            // An SSE answer whatever was asked.
            let meta = Meta {
                code: 200,
                content_type: SSE,
                close: call.close,
                retry_after: None,
                name: call.name,
            };
            w.out.clear();
            w.head(&meta, None, true);
            w.out.extend_from_slice(wire::LAST_CHUNK);
            w.flush_out(io).await?;
            return Ok(End::KeepAlive);
        }
        Behaviour::SlowHeader { ms } => {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            cx.created = wire::unix_secs();
        }
        Behaviour::SlowEvery { ms, every } if cx.n % (*every).max(1) == 0 => {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            cx.created = wire::unix_secs();
        }
        Behaviour::Stream { chunks, gap_ms } => {
            shape = StreamShape {
                chunks: *chunks,
                gap: Duration::from_millis(*gap_ms),
            };
        }
        _ => {}
    }
    cx.chunks = shape.chunks;
    let mut surface = build(call.endpoint, cx);
    let stream = call.stream && surface.streams();
    let meta = Meta {
        code: 200,
        content_type: if stream { SSE } else { JSON },
        close: call.close,
        retry_after: None,
        name: call.name,
    };
    if stream {
        if *behaviour == Behaviour::EmptyChoices {
            w.out.clear();
            w.head(&meta, None, true);
            surface.empty(&mut w.frames());
            w.out.extend_from_slice(wire::LAST_CHUNK);
            w.flush_out(io).await?;
            return Ok(End::KeepAlive);
        }
        sse(io, w, &meta, &mut *surface, shape.gap, &Plan::of(behaviour)).await
    } else {
        json(io, w, &meta, &mut *surface, behaviour).await
    }
}

// === Streams ===

#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// No opening events.
    Skip,
    /// The stream's own opening events (none for completions and chat tool calls).
    Normal,
    /// An opening event even where the stream has none.
    Forced,
}

/// How the stream ends.
enum Tail<'b> {
    /// The finishing events and the terminal chunk.
    Finish,
    /// An in-band error event and the terminal chunk.
    Error(Option<&'b str>),
    /// The terminal chunk alone.
    Cut,
    /// RST.
    Reset,
    /// FIN without the terminal chunk.
    Eof,
}

/// A stream, as one behaviour shapes it.
struct Plan<'b> {
    /// Flush the header alone, then wait this long.
    stall_first: Option<Duration>,
    start: Start,
    /// Content events to send; `None`: all of them.
    upto: Option<usize>,
    /// Wait this long after this many content events.
    stall_after: Option<(usize, Duration)>,
    tail: Tail<'b>,
}

impl<'b> Plan<'b> {
    fn of(behaviour: &'b Behaviour) -> Plan<'b> {
        let normal = Plan {
            stall_first: None,
            start: Start::Normal,
            upto: None,
            stall_after: None,
            tail: Tail::Finish,
        };
        match behaviour {
            Behaviour::MidStreamDeath { after_chunks } => Plan {
                upto: Some(*after_chunks),
                tail: Tail::Reset,
                ..normal
            },
            Behaviour::NoTerminal { chunks } => Plan {
                upto: Some(*chunks),
                tail: Tail::Cut,
                ..normal
            },
            Behaviour::OkThenEof => Plan {
                start: Start::Skip,
                upto: Some(0),
                tail: Tail::Eof,
                ..normal
            },
            Behaviour::InbandErrorFirst {
                error_type,
                after_start,
            } => Plan {
                start: if *after_start {
                    Start::Forced
                } else {
                    Start::Skip
                },
                upto: Some(0),
                tail: Tail::Error(error_type.as_deref()),
                ..normal
            },
            Behaviour::InbandErrorAfter { chunks, error_type } => Plan {
                upto: Some(*chunks),
                tail: Tail::Error(error_type.as_deref()),
                ..normal
            },
            Behaviour::StallBeforeFirst { ms } => Plan {
                stall_first: Some(Duration::from_millis(*ms)),
                ..normal
            },
            Behaviour::StallMidStream { after_chunks, ms } => Plan {
                stall_after: Some((*after_chunks, Duration::from_millis(*ms))),
                ..normal
            },
            _ => normal,
        }
    }
}

async fn pause(gap: Duration) {
    if !gap.is_zero() {
        tokio::time::sleep(gap).await;
    }
}

/// An SSE answer shaped by `plan`.
async fn sse<S: MockIo>(
    io: &mut S,
    w: &mut Writer,
    meta: &Meta<'_>,
    surface: &mut (dyn Surface + Send),
    gap: Duration,
    plan: &Plan<'_>,
) -> io::Result<End> {
    w.out.clear();
    w.head(meta, None, true);
    if let Some(stall) = plan.stall_first {
        w.flush_out(io).await?;
        tokio::time::sleep(stall).await;
    }
    match plan.start {
        Start::Skip => {}
        Start::Normal => surface.start(&mut w.frames(), false),
        Start::Forced => surface.start(&mut w.frames(), true),
    }
    let count = plan.upto.unwrap_or_else(|| surface.contents());
    for i in 0..count {
        if i > 0 {
            pause(gap).await;
        }
        if let Some((at, stall)) = plan.stall_after {
            if at == i {
                w.flush_out(io).await?;
                tokio::time::sleep(stall).await;
            }
        }
        surface.content(&mut w.frames(), i);
        w.flush_out(io).await?;
    }
    if let Some((at, stall)) = plan.stall_after {
        if at >= count {
            w.flush_out(io).await?;
            tokio::time::sleep(stall).await;
        }
    }
    match plan.tail {
        Tail::Finish | Tail::Error(_) => {
            if count > 0 {
                pause(gap).await;
            }
            match plan.tail {
                Tail::Error(error_type) => surface.error(&mut w.frames(), error_type),
                _ => surface.finish(&mut w.frames()),
            }
            w.out.extend_from_slice(wire::LAST_CHUNK);
            w.flush_out(io).await?;
            Ok(End::KeepAlive)
        }
        Tail::Cut => {
            w.out.extend_from_slice(wire::LAST_CHUNK);
            w.flush_out(io).await?;
            Ok(End::KeepAlive)
        }
        Tail::Reset | Tail::Eof => {
            if !w.out.is_empty() {
                // No event at all: still send the header (and any opening events).
                w.flush_out(io).await?;
            }
            Ok(if matches!(plan.tail, Tail::Reset) {
                End::Reset
            } else {
                End::Close
            })
        }
    }
}

// === JSON ===

/// A JSON answer shaped by `behaviour`.
async fn json<S: MockIo>(
    io: &mut S,
    w: &mut Writer,
    meta: &Meta<'_>,
    surface: &mut (dyn Surface + Send),
    behaviour: &Behaviour,
) -> io::Result<End> {
    w.ev.clear();
    match behaviour {
        Behaviour::InbandErrorFirst { error_type, .. }
        | Behaviour::InbandErrorAfter { error_type, .. } => {
            surface::inband_json(surface.dialect(), &mut w.ev, error_type.as_deref());
            w.send(io, meta).await?;
            return Ok(End::KeepAlive);
        }
        Behaviour::EmptyChoices => {
            surface.json_empty(&mut w.ev);
            w.send(io, meta).await?;
            return Ok(End::KeepAlive);
        }
        _ => surface.json(&mut w.ev),
    }
    let half = w.ev.len() / 2;
    match behaviour {
        Behaviour::MidStreamDeath { .. } => {
            w.out.clear();
            w.head(meta, Some(w.ev.len()), false);
            w.out.extend_from_slice(&w.ev[..half]);
            w.flush_out(io).await?;
            Ok(End::Reset)
        }
        Behaviour::OkThenEof => {
            w.out.clear();
            w.head(meta, Some(w.ev.len()), false);
            w.flush_out(io).await?;
            Ok(End::Close)
        }
        Behaviour::StallBeforeFirst { ms } => {
            w.out.clear();
            w.head(meta, Some(w.ev.len()), false);
            w.flush_out(io).await?;
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            w.out.extend_from_slice(&w.ev);
            w.flush_out(io).await?;
            Ok(End::KeepAlive)
        }
        Behaviour::StallMidStream { ms, .. } => {
            w.out.clear();
            w.head(meta, Some(w.ev.len()), false);
            w.out.extend_from_slice(&w.ev[..half]);
            w.flush_out(io).await?;
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            w.out.extend_from_slice(&w.ev[half..]);
            w.flush_out(io).await?;
            Ok(End::KeepAlive)
        }
        Behaviour::NoTerminal { .. } => {
            w.ev.truncate(half);
            w.send(io, meta).await?;
            Ok(End::KeepAlive)
        }
        _ => {
            w.send(io, meta).await?;
            Ok(End::KeepAlive)
        }
    }
}
