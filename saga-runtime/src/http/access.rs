//! Who may read and change things through the API. Every route that
//! changes something (start, cancel, resolve, retry, requeue, discard)
//! needs an [`Access`] the application configured, and the router is
//! read-only without one. Reads show business data (a task's input, its
//! steps' outputs, errors and audit log: customer data), so once an
//! [`Access`] is configured every read needs it too, unless the
//! application opened reads on purpose (`Api::public_reads`). With no
//! access configured there is nothing to check against: reads are open
//! (an API for local use; `exposure` warns when it is reached from
//! beyond loopback).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};

use super::reply::ApiError;
use super::ApiState;

/// Decides who is calling from the request's headers: `Some(operator)` is
/// allowed to change things (the name goes into the audit log), `None` is
/// refused with 401.
pub type Authorize = dyn Fn(&HeaderMap) -> Option<String> + Send + Sync;

/// How mutating routes are authorized.
#[derive(Clone, Default)]
pub(crate) enum Access {
    /// They answer 403: the router only reads.
    #[default]
    ReadOnly,
    /// `Authorization: Bearer <token>`; the operator is named by the
    /// `X-Operator` header (else `"token"`).
    Token(Arc<str>),
    /// The application's own check.
    Custom(Arc<Authorize>),
}

/// As whom a read is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reading {
    /// The request holds the API's access: an operator's budget, and the
    /// event-stream places kept for operators.
    Operator,
    /// Reads are open (no access configured, or `Api::public_reads`) and
    /// the request holds no access: the budget of anyone on the network.
    Anonymous,
}

impl Access {
    pub(crate) fn allows_changes(&self) -> bool {
        !matches!(self, Access::ReadOnly)
    }

    /// Whether a read with `headers` is served, and as whose: with an
    /// access configured and reads not `public`, only to a request that
    /// holds it (401 otherwise), by the same header or cookie check the
    /// changes use. A request another site's page made is never an
    /// operator's (its cookies are not its own): refused where reads need
    /// the access, anonymous where they are open.
    pub(crate) fn reading(&self, public: bool, headers: &HeaderMap) -> Result<Reading, ApiError> {
        let same_site = same_origin(headers);
        if same_site && self.authorizes(headers) {
            return Ok(Reading::Operator);
        }
        if public || !self.allows_changes() {
            return Ok(Reading::Anonymous);
        }
        if !same_site {
            return Err(cross_origin("reads"));
        }
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "reading this API needs authorization (Authorization: Bearer <token>)",
        ))
    }

    /// Whether the request holds the access changes need (for a read
    /// route that keeps room for operators).
    pub(crate) fn authorizes(&self, headers: &HeaderMap) -> bool {
        self.operator(headers).is_ok()
    }

    fn operator(&self, headers: &HeaderMap) -> Result<String, ApiError> {
        let unauthorized = || {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this action needs authorization (Authorization: Bearer <token>)",
            )
        };
        match self {
            Access::ReadOnly => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "read_only",
                "this API is read-only: the application must configure \
                 `Api::token` or `Api::authorize` to allow changes",
            )),
            Access::Token(token) => {
                let given = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .ok_or_else(unauthorized)?;
                if !same_secret(given.as_bytes(), token.as_bytes()) {
                    return Err(unauthorized());
                }
                let named = headers
                    .get("x-operator")
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim)
                    .filter(|v| !v.is_empty());
                Ok(named.unwrap_or("token").to_owned())
            }
            Access::Custom(authorize) => authorize(headers).ok_or_else(unauthorized),
        }
    }
}

/// Compares without stopping at the first difference, so the time taken
/// does not tell how much of a guessed token was right.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = given.len() ^ expected.len();
    for (i, b) in expected.iter().enumerate() {
        diff |= usize::from(given.get(i).copied().unwrap_or(!b) ^ b);
    }
    diff == 0
}

/// The operator allowed to make this request's change; extracting it is
/// what makes a route mutating.
pub(crate) struct Operator(pub String);

impl FromRequestParts<ApiState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        if !same_origin(&parts.headers) {
            return Err(cross_origin("changes"));
        }
        state.access.operator(&parts.headers).map(Operator)
    }
}

/// 403 `cross_origin`: `what` (changes, reads) is not served to another
/// site's page.
fn cross_origin(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "cross_origin",
        format!("{what} are not accepted from another site's page"),
    )
}

/// Whether a change comes from a page of this site, or from no page at
/// all (curl, a script). Browsers attach cookies to a form another site
/// submits here, so an [`Authorize`] that checks a session cookie would
/// let that site act as the operator (cross-site request forgery); they
/// also say where such a request comes from, and it is refused.
fn same_origin(headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header("sec-fetch-site").is_some_and(|site| site == "cross-site") {
        return false;
    }
    match (header("origin"), header("host")) {
        (None, _) => true,
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host)),
        (Some(_), None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abd", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"abcd", b"abc"));
        assert!(!same_secret(b"", b"abc"));
    }

    #[test]
    fn changes_from_another_site_are_refused() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, value.parse().unwrap());
            }
            map
        };
        assert!(same_origin(&headers(&[])));
        assert!(same_origin(&headers(&[
            ("host", "ops.local:8080"),
            ("origin", "http://ops.local:8080")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "ops.local:8080"),
            ("origin", "https://evil.example")
        ])));
        assert!(!same_origin(&headers(&[("host", "a"), ("origin", "null")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin")])));
    }

    #[test]
    fn reads_need_the_access_once_one_is_configured() {
        let none = HeaderMap::new();
        let mut token = HeaderMap::new();
        token.insert("authorization", "Bearer s3cret".parse().unwrap());
        let mut forged = token.clone();
        forged.insert("sec-fetch-site", "cross-site".parse().unwrap());
        let access = Access::Token("s3cret".into());
        let code = |r: Result<Reading, ApiError>| r.map_err(|e| e.status_and_code());
        assert_eq!(
            code(access.reading(false, &none)),
            Err((401, "unauthorized"))
        );
        assert_eq!(code(access.reading(false, &token)), Ok(Reading::Operator));
        assert_eq!(
            code(access.reading(false, &forged)),
            Err((403, "cross_origin"))
        );
        // Opened on purpose: anyone reads, as anonymous.
        assert_eq!(code(access.reading(true, &none)), Ok(Reading::Anonymous));
        assert_eq!(code(access.reading(true, &token)), Ok(Reading::Operator));
        assert_eq!(code(access.reading(true, &forged)), Ok(Reading::Anonymous));
        // Nothing to check against: open.
        assert_eq!(
            code(Access::ReadOnly.reading(false, &token)),
            Ok(Reading::Anonymous)
        );
    }

    #[test]
    fn read_only_refuses_and_tokens_name_the_operator() {
        let mut headers = HeaderMap::new();
        assert!(Access::ReadOnly.operator(&headers).is_err());
        let access = Access::Token("s3cret".into());
        assert!(access.operator(&headers).is_err());
        headers.insert("authorization", "Bearer wrong".parse().unwrap());
        assert!(access.operator(&headers).is_err());
        headers.insert("authorization", "Bearer s3cret".parse().unwrap());
        assert_eq!(access.operator(&headers).unwrap(), "token");
        headers.insert("x-operator", "ada".parse().unwrap());
        assert_eq!(access.operator(&headers).unwrap(), "ada");
    }
}
