//! The page, embedded in the binary at build time: no CDN, nothing fetched at run time.

use axum::{
    extract::Path,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use include_dir::{Dir, include_dir};

static ASSETS: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/src/plugin/dashboard/assets");

pub async fn index() -> Response {
    serve("index.html")
}

pub async fn file(Path(file): Path<String>) -> Response {
    serve(&file)
}

/// One embedded file by name (the directory is flat: a name with a slash is never found).
fn serve(name: &str) -> Response {
    match ASSETS.get_file(name).filter(|_| !name.contains('/')) {
        Some(f) => ([(header::CONTENT_TYPE, content_type(name))], f.contents()).into_response(),
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_its_scripts_are_embedded_and_served_with_their_types() {
        assert!(ASSETS.get_file("index.html").is_some(), "index.html is embedded");
        assert!(ASSETS.get_file("app.js").is_some(), "app.js is embedded (make dashboard builds it)");
        assert_eq!(content_type("app.js"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("index.html"), "text/html; charset=utf-8");
    }
}
