//! The web console: one static page that renders what the JSON API
//! returns. No template engine and no CDN: the page works offline, and
//! every number it shows is one a script can get from `/api` too.
//!
//! Its sources are split for reading (`console.html`, `console/console.css`,
//! `console/*.js`) and served as one response: the style and the scripts
//! are inlined into the markup once, on the first request. The page is
//! served with a strict `Content-Security-Policy` that allows exactly the
//! inline `<style>` and `<script>` blocks of the page as served, by their
//! SHA-256 hashes, computed from that same text: editing the page cannot
//! leave a stale hash behind, while anything injected into it (a script,
//! an `onclick=` attribute, a `style=` attribute, a frame around it)
//! is refused by the browser.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{Html, IntoResponse};
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// The markup, with a marker line where the style goes and one where the
/// scripts go.
const MARKUP: &str = include_str!("console.html");
const STYLE_MARK: &str = "/* @console.css: console.rs puts console/console.css here */";
const SCRIPT_MARK: &str = "// @console.js: console.rs puts console/*.js here";
const STYLE: &str = include_str!("console/console.css");
/// In this order, in one `<script>` (function declarations are hoisted, so
/// only `start()` at the end of the last one depends on the order).
const SCRIPTS: [&str; 3] = [
    include_str!("console/core.js"),
    include_str!("console/tasks.js"),
    include_str!("console/processes.js"),
];

/// The page as served and its policy.
struct Console {
    page: String,
    policy: String,
}

static CONSOLE: LazyLock<Console> = LazyLock::new(|| {
    let page = MARKUP
        .replacen(STYLE_MARK, STYLE, 1)
        .replacen(SCRIPT_MARK, &SCRIPTS.concat(), 1);
    let policy = policy(&page);
    Console { page, policy }
});

/// `GET /console`, with its security headers: the policy, no framing
/// (`frame-ancestors` for current browsers, `X-Frame-Options` for older
/// ones), no content sniffing, and no referrer (task ids in the fragment
/// stay in the page anyway; the API's URLs need not leave it).
pub(super) async fn page() -> impl IntoResponse {
    let console = &*CONSOLE;
    (
        [
            (header::CONTENT_SECURITY_POLICY, console.policy.as_str()),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        Html(console.page.as_str()),
    )
}

/// The Content-Security-Policy of `page`: nothing by default; its own
/// inline scripts and styles by hash (no `'unsafe-inline'`: inline event
/// handlers and `style` attributes are refused too); requests (`fetch`,
/// `EventSource`) to its own origin only; no framing, no `<base>`, no form
/// submissions (the page's forms are handled by its script).
fn policy(page: &str) -> String {
    let sources = |tag| {
        inline_blocks(page, tag)
            .into_iter()
            .map(|block| format!(" 'sha256-{}'", sha256_base64(block)))
            .collect::<String>()
    };
    format!(
        "default-src 'none'; script-src{}; style-src{}; connect-src 'self'; \
         img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        sources("script"),
        sources("style"),
    )
}

/// The text of every `<tag ...>...</tag>` block of `html` outside its
/// comments, exactly as the browser hashes it (between the opening tag's
/// `>` and the closing tag).
fn inline_blocks<'a>(html: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}"), format!("</{tag}>"));
    let mut blocks = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find(&open) {
        if let Some(comment) = rest[..at].find("<!--") {
            let Some(end) = rest[comment..].find("-->") else {
                break;
            };
            rest = &rest[comment + end + 3..];
            continue;
        }
        let after = &rest[at + open.len()..];
        // `<scripts>` or `<style-guide>` are other tags.
        if !after.starts_with(['>', ' ', '\t', '\n', '\r']) {
            rest = after;
            continue;
        }
        let Some(gt) = after.find('>') else { break };
        let body = &after[gt + 1..];
        let Some(end) = body.find(&close) else { break };
        blocks.push(&body[..end]);
        rest = &body[end + close.len()..];
    }
    blocks
}

fn sha256_base64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(text.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_is_inlined_once() {
        assert_eq!(MARKUP.matches(STYLE_MARK).count(), 1);
        assert_eq!(MARKUP.matches(SCRIPT_MARK).count(), 1);
        let page = &CONSOLE.page;
        assert!(!page.contains("@console."), "a marker is left");
        assert!(page.contains(STYLE));
        assert!(page.contains(&SCRIPTS.concat()));
        assert!(page.trim_end().ends_with("</html>"));
    }

    #[test]
    fn the_policy_allows_exactly_the_inline_blocks_by_hash() {
        let policy = &CONSOLE.policy;
        let script = format!("\n{}\n", SCRIPTS.concat());
        let style = format!("\n{STYLE}\n");
        assert!(
            policy.contains(&format!("script-src 'sha256-{}';", sha256_base64(&script))),
            "{policy}"
        );
        assert!(
            policy.contains(&format!("style-src 'sha256-{}';", sha256_base64(&style))),
            "{policy}"
        );
        assert!(!policy.contains("unsafe"), "{policy}");
        assert!(policy.starts_with("default-src 'none';"), "{policy}");
    }

    #[test]
    fn hashes_are_the_browsers() {
        // The SHA-256 of "" and of "abc" (FIPS 180-2), in base64.
        assert_eq!(
            sha256_base64(""),
            "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
        );
        assert_eq!(
            sha256_base64("abc"),
            "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0="
        );
    }

    #[test]
    fn blocks_are_found_with_or_without_attributes() {
        let html = "<!-- <script> and <style> --><scripts>no</scripts><script>a</script>x\
                    <script type=\"module\">b</script><style>c</style><script>";
        assert_eq!(inline_blocks(html, "script"), ["a", "b"]);
        assert_eq!(inline_blocks(html, "style"), ["c"]);
    }

    #[test]
    fn no_inline_handler_or_style_attribute() {
        // The policy refuses them; the page attaches its handlers in script.
        let page = &CONSOLE.page;
        for needle in [
            " onclick=",
            " onsubmit=",
            " oninput=",
            " onload=",
            " style=",
        ] {
            assert!(!page.contains(needle), "console has `{needle}`");
        }
    }
}
