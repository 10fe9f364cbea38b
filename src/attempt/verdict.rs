//! The verdict: what one attempt's answer is, from what the provider has sent so far.
//!
//! Both attempt drivers — Pingora's proxy loop (the fast path) and signalbox's own driver —
//! describe what they saw in the same words ([`Sent`]) and ask [`judge`]; neither decides
//! anything itself. The verdict is one of:
//! - [`Verdict::Pending`]: nothing decided yet, keep reading (a header whose body must be held,
//!   a stream before its first content);
//! - [`Verdict::Commit`]: this attempt's answer is the caller's; the driver writes it;
//! - [`Verdict::Ended`]: the attempt is over and its answer was (or is) the caller's: how it
//!   ended (`ok`, an empty or broken stream after the commit, the caller going away);
//! - [`Verdict::Retry`]: it failed before the commit point, with the outcome health counts and
//!   where the plan looks next ([`Scope`]); whether another attempt may run is
//!   [`super::schedule`]'s call;
//! - [`Verdict::Refuse`]: the provider refused the caller's request; it ends the request,
//!   relayed in signalbox's words.
//!
//! The commit point ([`CommitAt`]) is the first byte written to the caller: a stream under the
//! first-chunk hold commits at its first content event, a whole answer (JSON) when its body is
//! complete (up to [`HELD_BODY_LIMIT`]; a larger one at its header), a stream with the hold off
//! at its header. Before it every failure is a `Retry`; after it none is.
//!
//! Failover triggers: connect refused or timed out, TLS failure, reset or close before the
//! commit point, TTFB timeout, the statuses 5xx, 529, 429, 408, 404, 401, 402, 403 and any 1xx
//! or 3xx left over, an empty answer (`choices: []`, a stream without content), the provider's
//! own error event before content, an unreadable answer. 401/402/403/429 are credential-scoped:
//! the same deployment is tried with its next key first. Every other 4xx is the caller's fault
//! and is relayed (in signalbox's words), unless the policy fails over on client errors.

use super::outcome::{Advance, Outcome};

/// A whole answer (JSON) larger than this is committed at its header and relayed as it
/// arrives: holding more would hold the caller's memory hostage to one provider.
pub const HELD_BODY_LIMIT: usize = 1 << 20;

/// When an attempt's answer becomes the caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitAt {
    /// At the response header: a stream with the first-chunk hold off (the fast path).
    Header,
    /// At the first content event: a stream under the first-chunk hold.
    FirstContent,
    /// When the body is complete: a whole answer.
    WholeBody,
}

/// What a request's terms say about its attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    pub commit_at: CommitAt,
    /// A provider's refusal of the caller's request moves on (a policy's
    /// `failover_on_client_error`); a context-length refusal then needs a larger window.
    pub failover_on_client_error: bool,
}

/// The provider's own error (a stream's error event, or the error object of a whole answer),
/// by what it means for failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderError {
    /// Overloaded or rate limited: another target may serve.
    Overloaded,
    /// The provider failed.
    Server,
    /// The request itself was refused: another target would refuse it too.
    InvalidRequest,
}

/// An answer that could not be read in the dialect it claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// An answer with no choices (no content block, no output).
    EmptyChoices,
    /// Not JSON, or not the dialect's shape.
    Malformed,
}

/// What an answer's body has shown so far, as the relay read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shown {
    /// A content-bearing event passed (a text, tool-call or reasoning delta).
    pub content: bool,
    /// The stream's terminal event passed.
    pub terminal: bool,
    pub error: Option<ProviderError>,
    /// A body or chunk with `"choices": []` (an answer with nothing in it).
    pub empty_choices: bool,
    pub unreadable: Option<Unreadable>,
}

/// How a body read ended, so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// More may come.
    Open,
    /// The provider ended the body (by its framing).
    Complete,
    /// The body broke: reset, closed early, or a read that timed out or stalled.
    Broken(Outcome),
}

/// What the provider has sent on one attempt, as far as it got.
#[derive(Debug, Clone, Copy)]
pub enum Sent<'a> {
    /// No connection (already classified: refused, timed out, TLS, a local resource).
    Connect(Outcome),
    /// Connected, no response header. `reused`: the connection came from the pool;
    /// `written`: the whole request had been written when it failed.
    NoHeader {
        outcome: Outcome,
        reused: bool,
        written: bool,
    },
    /// The final (not 1xx) response header.
    Header { status: u16 },
    /// A 2xx answer's body so far. `sse`: the answer is a stream.
    Body {
        shown: &'a Shown,
        sse: bool,
        end: BodyEnd,
    },
    /// A refusal's whole body (read because the policy fails over on client errors), and
    /// whether it says the prompt is over the model's context window.
    Refusal { context_length: bool },
    /// The caller went away.
    Cancelled,
}

/// Where the plan looks after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The same target again on a fresh connection: a pooled connection failed before the
    /// request was written, so the provider never saw it.
    Fresh,
    /// Another credential of the same deployment first (401/402/403/429).
    Credential,
    /// Another deployment.
    Deployment,
    /// A deployment whose model has a larger context window (a context-length refusal).
    LargerContext,
}

impl Scope {
    /// The plan's word for it.
    pub fn advance(self) -> Advance {
        match self {
            Scope::Credential => Advance::NextCredential,
            _ => Advance::NextDeployment,
        }
    }
}

/// What one attempt's answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing decided yet: keep reading.
    Pending,
    /// The answer is the caller's from here: write it.
    Commit,
    /// The attempt is over and its answer is the caller's; how it ended.
    Ended(Outcome),
    /// Failed before the commit point.
    Retry { outcome: Outcome, scope: Scope },
    /// The provider refused the caller's request (in-band, or by status): relayed as the
    /// caller's error, and no other candidate is tried.
    Refuse { in_band: bool },
}

impl Verdict {
    /// How the attempt ended, once it has: what health, metrics and the ledger record.
    pub fn outcome(self) -> Option<Outcome> {
        match self {
            Verdict::Pending | Verdict::Commit => None,
            Verdict::Ended(o) | Verdict::Retry { outcome: o, .. } => Some(o),
            Verdict::Refuse { .. } => Some(Outcome::ClientError),
        }
    }
}

/// What an upstream status means for the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    /// 2xx: an answer.
    Success,
    /// A failure of the target or its credential.
    Failure { outcome: Outcome, scope: Scope },
    /// The caller's request was refused (every other 4xx).
    Refusal,
}

/// The one table of statuses.
pub fn classify_status(status: u16) -> StatusClass {
    let failure = |outcome, scope| StatusClass::Failure { outcome, scope };
    match status {
        200..=299 => StatusClass::Success,
        401..=403 => failure(Outcome::CredentialRejected, Scope::Credential),
        429 => failure(Outcome::RateLimited, Scope::Credential),
        404 => failure(Outcome::ModelNotFound, Scope::Deployment),
        408 | 500..=599 => failure(Outcome::ServerError, Scope::Deployment),
        400..=499 => StatusClass::Refusal,
        _ => failure(Outcome::UnexpectedStatus, Scope::Deployment),
    }
}

/// Judge an attempt from what it has sent so far. `committed`: the answer is already the
/// caller's (a byte of it went out).
pub fn judge(sent: Sent<'_>, terms: Terms, committed: bool) -> Verdict {
    let retry = |outcome| Verdict::Retry {
        outcome,
        scope: Scope::Deployment,
    };
    match sent {
        Sent::Connect(outcome) => retry(outcome),
        Sent::NoHeader {
            reused: true,
            written: false,
            ..
        } => Verdict::Retry {
            outcome: Outcome::StaleConnection,
            scope: Scope::Fresh,
        },
        Sent::NoHeader { outcome, .. } => retry(outcome),
        Sent::Header { status } => match classify_status(status) {
            StatusClass::Success if terms.commit_at == CommitAt::Header => Verdict::Commit,
            StatusClass::Success => Verdict::Pending,
            StatusClass::Failure { outcome, scope } => Verdict::Retry { outcome, scope },
            // The refusal's body says whether it is about the context window.
            StatusClass::Refusal if terms.failover_on_client_error => Verdict::Pending,
            StatusClass::Refusal => Verdict::Refuse { in_band: false },
        },
        Sent::Refusal { context_length } => Verdict::Retry {
            outcome: Outcome::ClientError,
            scope: if context_length {
                Scope::LargerContext
            } else {
                Scope::Deployment
            },
        },
        Sent::Cancelled => Verdict::Ended(Outcome::Cancelled),
        Sent::Body { shown, sse, end } => {
            if committed {
                judge_committed(shown, sse, end)
            } else {
                judge_held(shown, sse, end, terms.commit_at)
            }
        }
    }
}

/// A body before the commit point: is it an answer yet, a failure, or not decided?
fn judge_held(shown: &Shown, sse: bool, end: BodyEnd, commit_at: CommitAt) -> Verdict {
    let retry = |outcome| Verdict::Retry {
        outcome,
        scope: Scope::Deployment,
    };
    if let BodyEnd::Broken(outcome) = end {
        return retry(outcome);
    }
    let in_band_error = |kind| match kind {
        // The request itself was refused: another target would refuse it too.
        ProviderError::InvalidRequest => Verdict::Refuse { in_band: true },
        ProviderError::Server | ProviderError::Overloaded if sse => retry(Outcome::StreamError),
        ProviderError::Server | ProviderError::Overloaded => retry(Outcome::ServerError),
    };
    if sse && commit_at != CommitAt::WholeBody {
        // Under the first-chunk hold: the first content commits; anything that ends the
        // stream before it is a failure.
        if shown.content {
            return Verdict::Commit;
        }
        if shown.unreadable.is_some() {
            return retry(Outcome::ServerError);
        }
        if let Some(kind) = shown.error {
            return in_band_error(kind);
        }
        if shown.terminal || shown.empty_choices || end == BodyEnd::Complete {
            return retry(Outcome::Empty);
        }
        return Verdict::Pending;
    }
    if end == BodyEnd::Open {
        return Verdict::Pending;
    }
    // The whole answer is here.
    match shown.unreadable {
        Some(Unreadable::EmptyChoices) => return retry(Outcome::Empty),
        Some(Unreadable::Malformed) => return retry(Outcome::ServerError),
        None => {}
    }
    if let Some(kind) = shown.error {
        return in_band_error(kind);
    }
    if shown.empty_choices || (sse && !shown.content) {
        return retry(Outcome::Empty);
    }
    Verdict::Commit
}

/// A body after the commit point: nothing is retried; how did the attempt end?
fn judge_committed(shown: &Shown, sse: bool, end: BodyEnd) -> Verdict {
    match end {
        BodyEnd::Open => Verdict::Pending,
        BodyEnd::Broken(_) => Verdict::Ended(Outcome::StreamAborted),
        BodyEnd::Complete if sse => {
            if !shown.content && shown.error.is_none() {
                // An empty stream (its header went out before anything else could be seen).
                Verdict::Ended(Outcome::Empty)
            } else if shown.terminal && shown.error.is_none() && shown.unreadable.is_none() {
                Verdict::Ended(Outcome::Ok)
            } else {
                // Ended without its terminal event, or with the provider's error after
                // content: the caller's stream ended with an error event.
                Verdict::Ended(Outcome::StreamAborted)
            }
        }
        BodyEnd::Complete if shown.empty_choices || shown.unreadable.is_some() => {
            Verdict::Ended(Outcome::Empty)
        }
        BodyEnd::Complete => Verdict::Ended(Outcome::Ok),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Terms = Terms {
        commit_at: CommitAt::FirstContent,
        failover_on_client_error: false,
    };
    const WHOLE: Terms = Terms {
        commit_at: CommitAt::WholeBody,
        failover_on_client_error: false,
    };
    const AT_HEADER: Terms = Terms {
        commit_at: CommitAt::Header,
        failover_on_client_error: false,
    };

    fn body(shown: &Shown, sse: bool, end: BodyEnd) -> Sent<'_> {
        Sent::Body { shown, sse, end }
    }

    fn retry(outcome: Outcome) -> Verdict {
        Verdict::Retry {
            outcome,
            scope: Scope::Deployment,
        }
    }

    #[test]
    fn statuses() {
        assert_eq!(classify_status(200), StatusClass::Success);
        assert_eq!(classify_status(400), StatusClass::Refusal);
        assert_eq!(classify_status(422), StatusClass::Refusal);
        for s in [500, 502, 503, 504, 529, 408] {
            assert_eq!(
                classify_status(s),
                StatusClass::Failure {
                    outcome: Outcome::ServerError,
                    scope: Scope::Deployment
                },
                "{s}"
            );
        }
        for s in [401, 402, 403, 429] {
            assert!(
                matches!(
                    classify_status(s),
                    StatusClass::Failure {
                        scope: Scope::Credential,
                        ..
                    }
                ),
                "{s}"
            );
        }
        assert!(matches!(
            classify_status(302),
            StatusClass::Failure {
                outcome: Outcome::UnexpectedStatus,
                ..
            }
        ));
    }

    #[test]
    fn a_header_commits_only_where_the_commit_point_is_the_header() {
        let ok = Sent::Header { status: 200 };
        assert_eq!(judge(ok, AT_HEADER, false), Verdict::Commit);
        assert_eq!(judge(ok, HOLD, false), Verdict::Pending);
        assert_eq!(judge(ok, WHOLE, false), Verdict::Pending);
        assert_eq!(
            judge(Sent::Header { status: 400 }, WHOLE, false),
            Verdict::Refuse { in_band: false }
        );
        let lenient = Terms {
            failover_on_client_error: true,
            ..WHOLE
        };
        assert_eq!(
            judge(Sent::Header { status: 400 }, lenient, false),
            Verdict::Pending
        );
        assert_eq!(
            judge(
                Sent::Refusal {
                    context_length: true
                },
                lenient,
                false
            ),
            Verdict::Retry {
                outcome: Outcome::ClientError,
                scope: Scope::LargerContext
            }
        );
    }

    #[test]
    fn a_whole_answer_is_judged_when_complete() {
        let s = Shown::default();
        assert_eq!(
            judge(body(&s, false, BodyEnd::Open), WHOLE, false),
            Verdict::Pending
        );
        assert_eq!(
            judge(body(&s, false, BodyEnd::Complete), WHOLE, false),
            Verdict::Commit
        );
        // Death mid-body before the commit point: another candidate, never a short 200.
        assert_eq!(
            judge(
                body(&s, false, BodyEnd::Broken(Outcome::Reset)),
                WHOLE,
                false
            ),
            retry(Outcome::Reset)
        );
        let empty = Shown {
            empty_choices: true,
            ..Shown::default()
        };
        assert_eq!(
            judge(body(&empty, false, BodyEnd::Complete), WHOLE, false),
            retry(Outcome::Empty)
        );
        let malformed = Shown {
            unreadable: Some(Unreadable::Malformed),
            ..Shown::default()
        };
        assert_eq!(
            judge(body(&malformed, false, BodyEnd::Complete), WHOLE, false),
            retry(Outcome::ServerError)
        );
    }

    #[test]
    fn a_held_stream_commits_at_its_first_content() {
        let none = Shown::default();
        assert_eq!(
            judge(body(&none, true, BodyEnd::Open), HOLD, false),
            Verdict::Pending
        );
        assert_eq!(
            judge(body(&none, true, BodyEnd::Complete), HOLD, false),
            retry(Outcome::Empty)
        );
        let content = Shown {
            content: true,
            ..Shown::default()
        };
        assert_eq!(
            judge(body(&content, true, BodyEnd::Open), HOLD, false),
            Verdict::Commit
        );
        let refused = Shown {
            error: Some(ProviderError::InvalidRequest),
            ..Shown::default()
        };
        assert_eq!(
            judge(body(&refused, true, BodyEnd::Open), HOLD, false),
            Verdict::Refuse { in_band: true }
        );
        let overloaded = Shown {
            error: Some(ProviderError::Overloaded),
            ..Shown::default()
        };
        assert_eq!(
            judge(body(&overloaded, true, BodyEnd::Open), HOLD, false),
            retry(Outcome::StreamError)
        );
    }

    #[test]
    fn after_the_commit_nothing_is_retried() {
        let content = Shown {
            content: true,
            ..Shown::default()
        };
        assert_eq!(
            judge(
                body(&content, true, BodyEnd::Broken(Outcome::Reset)),
                AT_HEADER,
                true
            ),
            Verdict::Ended(Outcome::StreamAborted)
        );
        assert_eq!(
            judge(body(&content, true, BodyEnd::Complete), AT_HEADER, true),
            Verdict::Ended(Outcome::StreamAborted),
            "no terminal event"
        );
        let done = Shown {
            terminal: true,
            ..content
        };
        assert_eq!(
            judge(body(&done, true, BodyEnd::Complete), AT_HEADER, true),
            Verdict::Ended(Outcome::Ok)
        );
        assert_eq!(
            judge(
                body(&Shown::default(), true, BodyEnd::Complete),
                AT_HEADER,
                true
            ),
            Verdict::Ended(Outcome::Empty)
        );
    }

    #[test]
    fn a_pooled_connection_that_failed_before_the_request_was_written_is_called_again() {
        let stale = Sent::NoHeader {
            outcome: Outcome::Reset,
            reused: true,
            written: false,
        };
        assert_eq!(
            judge(stale, WHOLE, false),
            Verdict::Retry {
                outcome: Outcome::StaleConnection,
                scope: Scope::Fresh
            }
        );
        // Written: the provider may have it (and bill it): an attempt that moves on.
        let written = Sent::NoHeader {
            outcome: Outcome::Reset,
            reused: true,
            written: true,
        };
        assert_eq!(judge(written, WHOLE, false), retry(Outcome::Reset));
    }
}
