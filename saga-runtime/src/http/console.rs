//! The web console: one static page (HTML, CSS and script in one file,
//! compiled into the binary) that renders what the JSON API returns. No
//! template engine and no CDN: the page works offline, and every number
//! it shows is one a script can get from `/api` too.

use axum::response::Html;

/// `GET /console`.
pub(super) async fn page() -> Html<&'static str> {
    Html(include_str!("console.html"))
}
