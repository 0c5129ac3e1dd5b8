//! What the docs say about the example programs stays true: every HTTP
//! example limits routes, not the router's fallback, and the example
//! server's policies are the ones its README, its policy file and its
//! `--help` name.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(workspace().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// The Rust code of a markdown file (its `rust` and unlabelled blocks), or
/// of a source file, as `(line, text)`.
fn code_lines(path: &str) -> Vec<(usize, String)> {
    let text = read(path);
    if !path.ends_with(".md") {
        return text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.to_owned()))
            .collect();
    }
    let mut out = Vec::new();
    let mut in_rust = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if let Some(fence) = t.strip_prefix("```") {
            in_rust = match in_rust {
                Some(_) => None,
                None => {
                    let lang = fence.split(',').next().unwrap_or("").trim();
                    Some(lang.is_empty() || lang == "rust")
                }
            };
        } else if in_rust == Some(true) {
            out.push((i + 1, line.to_owned()));
        }
    }
    out
}

/// Every source file under `dir`, relative to the workspace.
fn rust_files(dir: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![workspace().join(dir)];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(workspace()).unwrap();
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// `Router::layer` (or a method router's `layer`) on a rate-limit layer:
/// every `.layer(` in code that builds a `RateLimitLayer`.
fn router_layer_calls(path: &str) -> Vec<String> {
    let lines = code_lines(path);
    if !lines.iter().any(|(_, l)| l.contains("RateLimitLayer")) {
        return Vec::new();
    }
    lines
        .iter()
        .filter(|(_, l)| {
            l.match_indices(".layer(")
                .any(|(i, _)| !l[..i].ends_with("route_"))
        })
        .map(|(n, l)| format!("{path}:{n}: {}", l.trim()))
        .collect()
}

#[test]
fn every_http_example_limits_routes_not_the_fallback() {
    let mut files = vec![
        "README.md".to_owned(),
        "ratelimit/README.md".to_owned(),
        "ratelimit-tower/README.md".to_owned(),
    ];
    files.extend(rust_files("examples/src"));
    files.extend(rust_files("ratelimit/src"));
    files.extend(rust_files("ratelimit-tower/src"));
    let mut routed = 0;
    let mut wrong = Vec::new();
    for f in &files {
        wrong.extend(router_layer_calls(f));
        routed += code_lines(f)
            .iter()
            .filter(|(_, l)| l.contains(".route_layer("))
            .count();
    }
    assert!(
        wrong.is_empty(),
        "`layer` also wraps the router's fallback: every unknown URL would be counted (and \
         answered 429 once the quota is spent). Use `route_layer` on the method router:\n{}",
        wrong.join("\n")
    );
    assert!(
        routed >= 5,
        "only {routed} route_layer calls found: is the scan reading the files?"
    );
}

#[test]
fn the_check_finds_a_router_layer() {
    let dir = std::env::temp_dir().join(format!("ratelimit-docs-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("README.md");
    std::fs::write(
        &file,
        "```rust\nlet app = Router::new()\n    .route(\"/login\", post(login))\n    \
         .layer(RateLimitLayer::new(limiter));\n```\n",
    )
    .unwrap();
    let found = router_layer_calls(file.to_str().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].ends_with(":4: .layer(RateLimitLayer::new(limiter));"),
        "{found:?}"
    );
}

/// The policy names the server's `--help` gives for `--config`.
fn server_policies() -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_server"))
        .arg("--help")
        .output()
        .expect("run the server binary");
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = help
        .lines()
        .find(|l| l.trim_start().starts_with("--config"))
        .unwrap_or_else(|| panic!("no --config in\n{help}"));
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_server_policies_are_the_ones_the_docs_name() {
    let names = server_policies();
    assert_eq!(names, ["api", "daily", "login"]);
    // The committed policy file states every one of them.
    let file = read("examples/policies.toml");
    let in_file: Vec<&str> = file
        .lines()
        .filter_map(|l| l.trim().strip_prefix("name = \""))
        .map(|l| l.split('"').next().unwrap())
        .collect();
    assert_eq!(in_file, names, "examples/policies.toml");
    let count = ["no", "one", "two", "three", "four"][names.len()];
    assert!(
        file.contains(&format!("knows {count} policies")),
        "examples/policies.toml's comment does not say the server knows {count} policies"
    );
    // The README shows that file as it is, and names each policy.
    let readme = read("README.md");
    assert!(
        readme.contains(&format!("```toml\n{file}```")),
        "README.md does not show examples/policies.toml as committed"
    );
    let sentence = readme
        .split("\n\n")
        .find(|p| p.starts_with("`--config` reads"))
        .expect("README.md's paragraph on --config");
    assert!(
        sentence.contains(&format!("{count} policies")),
        "README.md: {sentence}"
    );
    for name in &names {
        assert!(
            sentence.contains(&format!("`{name}`")),
            "README.md does not name {name}: {sentence}"
        );
    }
}
