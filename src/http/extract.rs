//! Extractors whose rejection is the contract's error: a handler names the input it needs
//! (`LockPath`, `LeasePath`, `Fields<T>`) and receives it parsed into domain types, or the
//! client receives a 400 with the error body.

use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::middleware::Named;
use super::types::parse_fields;
use crate::auth::Caller;
use crate::model::{FencingToken, LeaseId, LockName};

/// The parsed name, if the caller's token may use it (always, without authentication).
/// The request is logged under it either way (`middleware::Named`).
pub(super) fn in_scope(parts: &Parts, name: LockName) -> Result<LockName, ApiError> {
    if let Some(named) = parts.extensions.get::<Named>() {
        named.set(&name);
    }
    match parts.extensions.get::<Caller>() {
        Some(caller) if !caller.covers(name.as_str()) => Err(ApiError::Forbidden(format!(
            "the token {:?} may not use {name}: it is outside the token's prefixes",
            &*caller.name
        ))),
        _ => Ok(name),
    }
}

/// A request's fields, from its JSON body or its query parameters (either, not both), with
/// unknown fields refused. The body has already been read, within the client timeout and
/// the size limit, by the `read_body` middleware.
pub(crate) struct Fields<T>(pub T);

/// How a route's `{name}` is parsed: a lock's or an election's.
type ParseName = fn(&str) -> Result<LockName, crate::model::InvalidInput>;

/// The `{name}` of a route, parsed by `parse` and within the caller's prefixes.
async fn name<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
    parse: ParseName,
) -> Result<LockName, ApiError> {
    let Path(name) = Path::<String>::from_request_parts(parts, state)
        .await
        .map_err(|e| ApiError::Invalid(e.body_text()))?;
    in_scope(parts, parse(&name)?)
}

/// The `{name}` and `{lease_id}` of a route, parsed likewise.
async fn name_and_lease<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
    parse: ParseName,
) -> Result<(LockName, LeaseId), ApiError> {
    let (name, id) = name_and_segment(parts, state).await?;
    Ok((in_scope(parts, parse(&name)?)?, LeaseId::parse(&id)?))
}

/// The `{name}` and the segment after it (a lease id, a fencing token), as sent.
async fn name_and_segment<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
) -> Result<(String, String), ApiError> {
    let Path(both) = Path::<(String, String)>::from_request_parts(parts, state)
        .await
        .map_err(|e| ApiError::Invalid(e.body_text()))?;
    Ok(both)
}

/// The `{name}` and `{fencing_token}` of a route: a token is a whole number from 1.
async fn name_and_token<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
    parse: ParseName,
) -> Result<(LockName, FencingToken), ApiError> {
    let (name, token) = name_and_segment(parts, state).await?;
    let name = in_scope(parts, parse(&name)?)?;
    let token = token
        .parse::<u64>()
        .ok()
        .filter(|t| *t >= 1 && token.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            ApiError::Invalid(format!(
                "fencing_token must be a whole number from 1, got {token:?}"
            ))
        })?;
    Ok((name, FencingToken::new(token)))
}

/// Each kind's path extractors, `{name}`, and `{name}` with `{lease_id}` or with
/// `{fencing_token}`, parsed as that
/// kind's name and within the caller's prefixes: a new kind is a line below.
macro_rules! kind_paths {
    ($($kind:literal: $name_path:ident, $lease_path:ident, $fence_path:ident => $parse:path;)*) => {$(
        #[doc = concat!("The `{name}` of ", $kind, " route, parsed.")]
        pub(crate) struct $name_path(pub LockName);

        #[doc = concat!("The `{name}` and `{lease_id}` of ", $kind, "'s lease route, parsed.")]
        pub(crate) struct $lease_path(pub LockName, pub LeaseId);

        #[doc = concat!("The `{name}` and `{fencing_token}` of ", $kind, "'s fence route, parsed.")]
        pub(crate) struct $fence_path(pub LockName, pub FencingToken);

        impl<S: Send + Sync> FromRequestParts<S> for $fence_path {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
                let (name, token) = name_and_token(parts, state, $parse).await?;
                Ok(Self(name, token))
            }
        }

        impl<S: Send + Sync> FromRequestParts<S> for $name_path {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
                name(parts, state, $parse).await.map(Self)
            }
        }

        impl<S: Send + Sync> FromRequestParts<S> for $lease_path {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
                let (name, id) = name_and_lease(parts, state, $parse).await?;
                Ok(Self(name, id))
            }
        }
    )*};
}

kind_paths! {
    "a lock": LockPath, LeasePath, FencePath => LockName::parse;
    "an election": ElectionPath, ElectionLeasePath, ElectionFencePath => LockName::election;
    "a semaphore": SemaphorePath, PermitPath, SemaphoreFencePath => LockName::semaphore;
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Fields<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let query = request.uri().query().map(str::to_owned);
        let body = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(|e| {
                if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::TooLarge
                } else {
                    ApiError::Invalid(e.body_text())
                }
            })?;
        Ok(Self(parse_fields(query.as_deref(), &body)?))
    }
}
