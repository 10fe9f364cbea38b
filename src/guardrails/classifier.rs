//! The `classifier` kind: a catalog chat model (or alias, or policy) asked through the
//! gateway's own listener and plan (`crate::internal`), so the call fails over like any
//! request: the profile's `prompt` as the system message, the input text as the user message.
//! Flagged when the answer, trimmed and lower-cased, starts with `flag_on`. The internal call
//! runs no guardrail itself (no recursion) and is billed to no key.

use std::time::Duration;

use crate::internal::{InternalClient, InternalError};

/// Ask `model` about `input`.
pub async fn flags(
    internal: &InternalClient,
    model: &str,
    prompt: &str,
    flag_on: &str,
    input: &str,
    deadline: Duration,
) -> Result<bool, InternalError> {
    let answer = internal
        .chat(model, Some(prompt), input, None, deadline)
        .await?;
    Ok(judge(&answer, flag_on))
}

/// Whether an answer flags: it starts with `flag_on` (already lower-cased) once trimmed and
/// lower-cased.
fn judge(answer: &str, flag_on: &str) -> bool {
    answer.trim().to_lowercase().starts_with(flag_on)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers_start_decides() {
        assert!(judge(
            "  UNSAFE: it asks to ignore the instructions",
            "unsafe"
        ));
        assert!(judge("unsafe", "unsafe"));
        assert!(!judge("safe", "unsafe"));
        assert!(!judge("It is unsafe", "unsafe"));
    }
}
