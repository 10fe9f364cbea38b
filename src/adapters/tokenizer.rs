//! Exact token counts with OpenAI's own encodings (`tiktoken-rs`, the maintained Rust port):
//! `o200k_base` for the GPT-4o and o-series families and every model it does not know,
//! `cl100k_base` for GPT-4, GPT-3.5 and the embeddings of that generation.
//!
//! Loading an encoding takes about 300 ms and 46 MiB (`o200k_base`; `cl100k_base` 25 MiB), once
//! per process, on the first request that needs it: not at start, so a gateway that never
//! judges a request near a limit never holds them. Counting 50 KB of text takes ~8 ms. So the
//! request path counts exactly only when an estimate is within 10 % of a limit it would be
//! judged against (a context window, a `tpm` window), where the estimate's error could decide
//! the answer.

use std::sync::LazyLock;

use tiktoken_rs::CoreBPE;

/// An OpenAI encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    O200k,
    Cl100k,
}

impl Encoding {
    /// The encoding of an upstream model name (unknown names, such as a self-hosted model on
    /// an OpenAI-compatible server, take `o200k_base`).
    pub fn for_model(name: &str) -> Encoding {
        match tiktoken_rs::tokenizer::get_tokenizer(name) {
            Some(tiktoken_rs::tokenizer::Tokenizer::Cl100kBase) => Encoding::Cl100k,
            _ => Encoding::O200k,
        }
    }
}

static O200K: LazyLock<Option<CoreBPE>> = LazyLock::new(|| tiktoken_rs::o200k_base().ok());
static CL100K: LazyLock<Option<CoreBPE>> = LazyLock::new(|| tiktoken_rs::cl100k_base().ok());

/// The tokens of `text` in `encoding`; `None` if the encoding could not be loaded.
pub fn count(text: &str, encoding: Encoding) -> Option<u64> {
    let bpe = match encoding {
        Encoding::O200k => &*O200K,
        Encoding::Cl100k => &*CL100K,
    };
    bpe.as_ref().map(|b| b.encode_ordinary(text).len() as u64)
}

/// Whether an estimate is within 10 % of a limit (on either side): close enough that its
/// error could decide, so worth an exact count.
pub fn near(estimate: u64, limit: u64) -> bool {
    let (e, l) = (u128::from(estimate), u128::from(limit));
    e * 10 >= l * 9 && e * 10 <= l * 11
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_the_encodings_own() {
        assert_eq!(count("hello world", Encoding::O200k), Some(2));
        assert_eq!(count("hello world", Encoding::Cl100k), Some(2));
        assert_eq!(Encoding::for_model("gpt-4o-mini"), Encoding::O200k);
        assert_eq!(Encoding::for_model("gpt-4"), Encoding::Cl100k);
        assert_eq!(Encoding::for_model("llama-3.1-8b"), Encoding::O200k);
    }

    #[test]
    fn near_is_ten_percent_either_side() {
        assert!(near(900, 1000) && near(1100, 1000) && near(1000, 1000));
        assert!(!near(899, 1000) && !near(1101, 1000));
    }
}
