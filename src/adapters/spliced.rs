//! [`Spliced`]: an attempt's request body as the caller's bytes with a few edits, kept as its
//! pieces in order (slices of the caller's body, and the edits' own bytes).
//!
//! A same-dialect attempt's body differs from the caller's only by its `model` value (and a
//! `routing` member removed, a `stream_options` inserted). Built as one buffer it is a copy of
//! the whole body per attempt target (~2 KiB for a chat request, most of its cost, issue 22);
//! as pieces it is a few reference counts, and the one-write send hands them to the kernel in
//! one vectored write (`proxy::wire`). Where one contiguous buffer is needed (Pingora's own
//! body writes, a TLS stream, a translation's parser) [`Spliced::to_bytes`] makes it, once.

use bytes::{BufMut, Bytes, BytesMut};
use smallvec::SmallVec;

/// Most pieces a body has: three edits, each with the caller's bytes before it, and the
/// caller's bytes after the last.
const MOST: usize = 7;

/// A body as its pieces, in order (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spliced {
    pieces: SmallVec<[Bytes; MOST]>,
    len: usize,
}

impl Spliced {
    /// A body of one piece (no copy).
    pub fn whole(bytes: Bytes) -> Self {
        let mut body = Self::default();
        body.push(bytes);
        body
    }

    /// Append a piece (an empty one is left out).
    pub fn push(&mut self, piece: Bytes) {
        if !piece.is_empty() {
            self.len += piece.len();
            self.pieces.push(piece);
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces, in order, none empty.
    pub fn pieces(&self) -> &[Bytes] {
        &self.pieces
    }

    /// The body as one buffer: its only piece itself, else the pieces copied into one.
    pub fn to_bytes(&self) -> Bytes {
        match self.pieces.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            pieces => {
                let mut out = BytesMut::with_capacity(self.len);
                for piece in pieces {
                    out.put_slice(piece);
                }
                out.freeze()
            }
        }
    }
}

impl From<Bytes> for Spliced {
    fn from(bytes: Bytes) -> Self {
        Self::whole(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_read_as_the_bytes_they_join_to() {
        let mut body = Spliced::default();
        assert!(body.is_empty());
        assert_eq!(body.to_bytes(), Bytes::new());
        let whole = Bytes::from_static(b"{\"model\":\"m\",\"x\":1}");
        body.push(whole.slice(..9));
        body.push(Bytes::new());
        body.push(Bytes::from_static(b"\"up\""));
        body.push(whole.slice(12..));
        assert_eq!(body.pieces().len(), 3, "an empty piece is left out");
        assert_eq!(body.len(), 20);
        assert_eq!(&body.to_bytes()[..], b"{\"model\":\"up\",\"x\":1}");
        // One piece is itself, not a copy.
        let one = Spliced::whole(whole.clone());
        assert_eq!(one.to_bytes().as_ptr(), whole.as_ptr());
    }
}
