//! Who may read through the API, and how much of the store one read may
//! make it send. Extracting a [`Reader`] is what makes a route a read: it
//! refuses the request where reads need the API's access
//! ([`Access::reading`]), and gives the handler the budget of whoever
//! asks. An operator's pages and scans are as large as the application
//! allows ([`Api::scan_limit`](super::Api::scan_limit), 1,000 rows); an
//! anonymous reader's (reads open: no access configured, or
//! [`Api::public_reads`](super::Api::public_reads)) read at most
//! [`Api::public_read_limit`](super::Api::public_read_limit) records of
//! each saga or process manager: one request from anyone on the network
//! costs the store a page, whatever its filter or `limit` says.

use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;

use super::access::Reading;
use super::reply::ApiError;
use super::ApiState;

/// Records one anonymous read reads at most, by default
/// ([`Api::public_read_limit`](super::Api::public_read_limit)).
pub const DEFAULT_PUBLIC_READ_LIMIT: usize = 50;

/// Rows of a page when the request names no `limit`.
const DEFAULT_ROWS: usize = 50;

/// How reads are served, as the application configured them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadRules {
    /// Reads are open to requests without the API's access
    /// ([`Api::public_reads`](super::Api::public_reads)).
    pub(crate) public: bool,
    /// The most records one anonymous read reads.
    pub(crate) public_limit: usize,
}

/// A read allowed, with its budget.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reader {
    reading: Reading,
    public_limit: usize,
}

impl Reader {
    /// Whether the request holds the API's access.
    pub(crate) fn operator(&self) -> bool {
        self.reading == Reading::Operator
    }

    /// The rows of a page: `asked` (50 if not given or 0), at most `max`
    /// for an operator and the public read limit for anyone else.
    pub(crate) fn rows(&self, asked: Option<usize>, max: usize) -> usize {
        let asked = asked.filter(|n| *n > 0).unwrap_or(DEFAULT_ROWS);
        asked.min(self.cap(max))
    }

    /// The most records a filtered read reads looking for matches (or a
    /// count reads to count them): `budget` for an operator, the public
    /// read limit for anyone else.
    pub(crate) fn scan(&self, budget: usize) -> usize {
        self.cap(budget)
    }

    fn cap(&self, operator: usize) -> usize {
        match self.reading {
            Reading::Operator => operator,
            Reading::Anonymous => operator.min(self.public_limit),
        }
    }
}

impl FromRequestParts<ApiState> for Reader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        let rules = state.reads;
        let reading = state.access.reading(rules.public, &parts.headers)?;
        state.exposure.note(parts);
        Ok(Reader {
            reading,
            public_limit: rules.public_limit,
        })
    }
}

/// A route merged from outside the API's own (`GET /metrics`) read under
/// the same rule.
pub(crate) async fn gate(_reader: Reader, request: Request, next: Next) -> Response {
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_readers_get_a_page_at_most() {
        let reader = |reading| Reader {
            reading,
            public_limit: 50,
        };
        let (operator, anonymous) = (reader(Reading::Operator), reader(Reading::Anonymous));
        assert_eq!(operator.rows(None, 1000), 50);
        assert_eq!(operator.rows(Some(0), 1000), 50);
        assert_eq!(operator.rows(Some(700), 1000), 700);
        assert_eq!(operator.rows(Some(5000), 1000), 1000);
        assert_eq!(anonymous.rows(Some(700), 1000), 50);
        assert_eq!(anonymous.rows(Some(7), 1000), 7);
        assert_eq!(anonymous.rows(Some(700), 20), 20);
        assert_eq!(operator.scan(5000), 5000);
        assert_eq!(anonymous.scan(5000), 50);
    }
}
