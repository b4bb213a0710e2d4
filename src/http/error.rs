//! The one error type of the HTTP boundary. Each variant names its status and its
//! contract error code; internal causes are logged, never sent to the client.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::lease::LeaseError;
use crate::model::{InvalidInput, MasterFailure};
use crate::wire::{ErrorBody, MasterError};

impl From<&MasterFailure> for MasterError {
    fn from(f: &MasterFailure) -> Self {
        Self {
            address: f.address.clone(),
            error: f.kind.to_owned(),
        }
    }
}

/// Why a request is unauthorized: it says which of the two, never which tokens exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Credentials {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A token the token file does not know.
    Unknown,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// 400 `invalid_request`: a bad name, lease id, field or value.
    #[error("{0}")]
    Invalid(String),
    /// 408 `request_timeout`: the client did not send its whole body in time.
    #[error("the request body did not arrive in time")]
    RequestTimeout,
    /// 413 `invalid_request`: the body is larger than the limit.
    #[error("request body too large")]
    TooLarge,
    /// 409 `lock_held`: another lease holds the lock.
    #[error("the lock is held by another lease")]
    LockHeld { retry_after: Duration },
    /// 409 `lock_held` on a campaign: another candidate leads the election.
    #[error("another candidate leads this election")]
    Led { retry_after: Duration },
    /// 409 `lock_held` on a semaphore: every permit below the grant's limit is taken.
    #[error("every permit of this semaphore is taken")]
    Full { retry_after: Duration },
    /// 409 `lock_delay`: the lock is free, but the lock-delay of a lease that ended without
    /// its holder's revoke lasts `retry_after` more.
    #[error(
        "the lock is in its lock-delay: its last lease ended without a revoke (expired, or force-released), and the name is not granted until the delay has passed"
    )]
    LockDelay { retry_after: Duration },
    /// 404 `session_not_found`: no such session (expired, ended, or never opened).
    #[error("no such session: it expired, was ended, or never existed")]
    SessionNotFound,
    /// 404 `lease_not_found`: no such lease holds the lock (expired, revoked or never granted).
    #[error("no such lease holds this lock: it expired, was revoked, or never existed")]
    LeaseNotFound,
    /// 404 `lease_not_found` on a grant: the lease its Idempotency-Key stands for was
    /// granted and has ended (revoked or force-released); a retry does not lock again.
    #[error(
        "the lease granted for this Idempotency-Key has ended (revoked or force-released); lock again with a new key"
    )]
    KeyEnded,
    /// 422 `idempotency_mismatch`: the Idempotency-Key was used for another request.
    #[error(
        "this Idempotency-Key was used for another request (another name, ttl_ms or owner) within its TTL; use a new key"
    )]
    IdempotencyMismatch,
    /// 503 `quorum_unavailable`: fewer than a majority of masters could take part (which
    /// failed, and how, when known), or the process is shutting down.
    #[error("{message}")]
    Unavailable {
        message: String,
        masters: Vec<MasterFailure>,
    },
    /// 503 `shutting_down`: this replica is stopping; the masters may be healthy, and
    /// another replica can serve the request.
    #[error("this replica is shutting down; ask another replica")]
    ShuttingDown,
    /// 401 `unauthorized`: no bearer token, or one the token file does not know.
    #[error("{}", match .0 {
        Credentials::Missing => "a bearer token is required (Authorization: Bearer <token>)",
        Credentials::Unknown => "the bearer token is not known to this server (mistyped, revoked, or for another deployment)",
    })]
    Unauthorized(Credentials),
    /// 403 `forbidden`: the token's role or prefixes do not allow this.
    #[error("{0}")]
    Forbidden(String),
    /// 429 `too_many_requests`: past a cap (waiting grants, streams) or the token's rate.
    #[error("{message}")]
    TooMany {
        message: String,
        retry_after: Duration,
    },
    /// 404 `not_found`: no such route.
    #[error("no such route")]
    NoRoute,
    /// 404 `not_found`: a route this replica could serve, but was not given what it serves
    /// (the reason says what to set).
    #[error("{0}")]
    NotServed(&'static str),
    /// 405 `method_not_allowed`, with a hint where a likely mistake has one.
    #[error("method not allowed on this route{}", .0.map(|hint| format!(": {hint}")).unwrap_or_default())]
    MethodNotAllowed(Option<&'static str>),
    /// 500 `internal`: a bug; the details are in the log.
    #[error("internal error")]
    Internal,
}

impl ApiError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::LockHeld { .. }
            | ApiError::Led { .. }
            | ApiError::Full { .. }
            | ApiError::LockDelay { .. } => StatusCode::CONFLICT,
            ApiError::LeaseNotFound
            | ApiError::KeyEnded
            | ApiError::SessionNotFound
            | ApiError::NoRoute
            | ApiError::NotServed(_) => StatusCode::NOT_FOUND,
            ApiError::IdempotencyMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unavailable { .. } | ApiError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::TooMany { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The contract's error code; also the `outcome` label of request metrics.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            ApiError::Invalid(_) | ApiError::TooLarge => "invalid_request",
            ApiError::RequestTimeout => "request_timeout",
            ApiError::LockHeld { .. } | ApiError::Led { .. } | ApiError::Full { .. } => "lock_held",
            ApiError::LockDelay { .. } => "lock_delay",
            ApiError::LeaseNotFound | ApiError::KeyEnded => "lease_not_found",
            ApiError::SessionNotFound => "session_not_found",
            ApiError::IdempotencyMismatch => "idempotency_mismatch",
            ApiError::Unavailable { .. } => "quorum_unavailable",
            ApiError::ShuttingDown => "shutting_down",
            ApiError::NoRoute | ApiError::NotServed(_) => "not_found",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::TooMany { .. } => "too_many_requests",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::Internal => "internal",
        }
    }
}

impl From<InvalidInput> for ApiError {
    fn from(e: InvalidInput) -> Self {
        ApiError::Invalid(e.0)
    }
}

impl ApiError {
    /// The same error as a campaign's: "held" there means another candidate leads.
    pub(crate) fn in_election(self) -> Self {
        match self {
            ApiError::LockHeld { retry_after } => ApiError::Led { retry_after },
            e => e,
        }
    }

    /// The same error as a permit's: "held" there means every permit is taken.
    pub(crate) fn in_semaphore(self) -> Self {
        match self {
            ApiError::LockHeld { retry_after } => ApiError::Full { retry_after },
            e => e,
        }
    }

    /// 503 for a reason of our own, with no master to blame.
    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        ApiError::Unavailable {
            message: message.into(),
            masters: Vec::new(),
        }
    }
}

impl From<LeaseError> for ApiError {
    fn from(e: LeaseError) -> Self {
        match e {
            LeaseError::Held { retry_after } => ApiError::LockHeld { retry_after },
            LeaseError::Delayed { retry_after } => ApiError::LockDelay { retry_after },
            LeaseError::NotFound => ApiError::LeaseNotFound,
            LeaseError::SessionNotFound => ApiError::SessionNotFound,
            LeaseError::KeyEnded => ApiError::KeyEnded,
            LeaseError::IdempotencyMismatch => ApiError::IdempotencyMismatch,
            LeaseError::Unavailable(why) => ApiError::Unavailable {
                message: why.reason,
                masters: why.masters,
            },
            LeaseError::ShuttingDown => ApiError::ShuttingDown,
            e @ LeaseError::NotYours => ApiError::Forbidden(e.to_string()),
            LeaseError::TooMany { what } => ApiError::TooMany {
                message: what,
                retry_after: Duration::from_secs(1),
            },
        }
    }
}

impl ApiError {
    fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::LockHeld { retry_after }
            | ApiError::Led { retry_after }
            | ApiError::Full { retry_after }
            | ApiError::LockDelay { retry_after }
            | ApiError::TooMany { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The contract's error body for this error (also what a stream's `failed` event
    /// carries).
    pub(crate) fn body(&self) -> ErrorBody {
        let masters = match self {
            ApiError::Unavailable { masters, .. } => {
                masters.iter().map(MasterError::from).collect()
            }
            _ => Vec::new(),
        };
        ErrorBody {
            error: self.code().to_owned(),
            message: self.to_string(),
            retry_after_ms: self.retry_after().map(crate::model::millis),
            masters,
        }
    }
}

/// The outcome an answer reports for the log line and metrics: `ok` or an error code (set
/// by `ApiError`'s response, read by the access log in `middleware`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome(pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let retry_after = self.retry_after();
        let body = self.body();
        if let ApiError::Unavailable { message, masters } = &self {
            let masters: Vec<String> = masters
                .iter()
                .map(|m| format!("{} {}", m.address, m.kind))
                .collect();
            tracing::warn!(reason = %message, ?masters, "request failed: quorum unavailable");
        }
        let mut response = (status, Json(body)).into_response();
        response.extensions_mut().insert(Outcome(self.code()));
        if matches!(self, ApiError::Unauthorized(_)) {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"redlockd\""),
            );
        }
        if let Some(after) = retry_after {
            // Whole seconds, rounded up, at least 1: a client that honours it never retries
            // before the holder's lease could have lapsed.
            let secs = after.as_millis().div_ceil(1000).max(1);
            if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_at_least_one() {
        let header = |ms| {
            ApiError::LockHeld {
                retry_after: Duration::from_millis(ms),
            }
            .into_response()
            .headers()[header::RETRY_AFTER]
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(header(0), "1");
        assert_eq!(header(999), "1");
        assert_eq!(header(1001), "2");
        assert_eq!(header(30_000), "30");
    }
}
