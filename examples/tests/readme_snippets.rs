//! Every Rust example of the READMEs a newcomer reads is built (and, unless
//! marked `no_run`, run) the way the README tells a newcomer to: in a new
//! cargo project outside the workspace, with exactly the `cargo add` lines
//! of the `sh` block before it: the READMEs add the facade by path
//! (`cargo add --path "$CHECKOUT/ratelimit" ...`, the crates are not on
//! the public crate registry yet), and `$CHECKOUT` is this workspace.
//!
//! An example that talks to Redis (marked `no_run` for rustdoc, which has
//! no server) reads its servers' URLs from `REDIS_URL` and
//! `REDIS_CLUSTER_URL`, with the usual local addresses as defaults: this
//! test runs it with those set to a `redis-server` and a Redis Cluster it
//! starts, fresh, and checks that it prints exactly the `text` block that
//! follows it in its section (the README's "it prints").
//!
//! The examples are also checked for what a reader copying them would trip
//! on: hidden rustdoc lines (`# ...`, shown as text on GitHub), no `main`,
//! no `cargo add` lines.
//!
//! The projects start from the workspace's `Cargo.lock` and resolve offline
//! first, against the crates cargo already has (the workspace's own build
//! fetched them); a project that needs a crate the workspace never fetched
//! (a `cargo add axum` with axum's default features) resolves again online.
//! They share one target directory under the workspace's, so a second run
//! takes seconds.

use std::path::{Path, PathBuf};
use std::process::Command;

use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::redis_server::RedisServer;

/// The READMEs whose examples are checked.
const READMES: [&str; 3] = [
    "README.md",
    "ratelimit/README.md",
    "ratelimit-tower/README.md",
];

/// The facade as the `cargo add` lines name it: by path, in the checkout.
const FACADE: &str = "$CHECKOUT/ratelimit";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// A fenced code block.
#[derive(Debug)]
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    /// The info string (`rust,no_run`, `sh`, ...).
    info: String,
    /// The heading of the section it is in.
    section: String,
    code: Vec<String>,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut section = String::from("(top)");
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        match open.as_mut() {
            Some(block) => {
                if line.trim_start().starts_with("```") {
                    out.push(open.take().unwrap());
                } else {
                    block.code.push(line.to_owned());
                }
            }
            None if line.trim_start().starts_with("```") => {
                open = Some(Block {
                    line: i + 1,
                    info: line.trim_start().trim_start_matches('`').trim().to_owned(),
                    section: section.clone(),
                    code: Vec::new(),
                });
            }
            None if line.starts_with('#') => section = line.trim().to_owned(),
            None => {}
        }
    }
    out
}

/// Whether rustdoc reads the block as Rust (an unlabelled block is Rust).
fn is_rust(info: &str) -> bool {
    let lang = info.split(',').next().unwrap_or("").trim();
    lang.is_empty() || lang == "rust"
}

/// One example to build, with what it needs.
#[derive(Debug)]
struct Example {
    name: String,
    code: String,
    adds: Vec<Vec<String>>,
    run: bool,
    /// It talks to Redis: run it against real servers (see the module docs).
    redis: bool,
    /// What it prints, when its README says so.
    prints: Option<String>,
}

/// The examples of one README, or what is wrong with them.
fn examples(readme: &str) -> Result<Vec<Example>, Vec<String>> {
    let text = std::fs::read_to_string(workspace().join(readme))
        .unwrap_or_else(|e| panic!("read {readme}: {e}"));
    let blocks = blocks(&text);
    let mut found = Vec::new();
    let mut problems = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        if !is_rust(&block.info) {
            continue;
        }
        let name = format!("{readme}:{} ({})", block.line, block.section);
        if block.info.split(',').any(|a| a.trim() == "ignore") {
            problems.push(format!(
                "{name}: marked `ignore`: a README example must build"
            ));
            continue;
        }
        for (j, l) in block.code.iter().enumerate() {
            let t = l.trim_start();
            if t == "#" || t.starts_with("# ") {
                problems.push(format!(
                    "{name}, line {}: a hidden rustdoc line ({t:?}) shows as text when the \
                     README is read or copied; write the example out whole",
                    block.line + 1 + j
                ));
            }
        }
        let code = block.code.join("\n") + "\n";
        if !code.contains("fn main(") {
            problems.push(format!(
                "{name}: no `fn main`: a README example is a complete program a newcomer can \
                 paste into src/main.rs"
            ));
        }
        // The cargo add lines: the last `sh` block before it in its section.
        let adds: Vec<Vec<String>> = blocks[..i]
            .iter()
            .rev()
            .take_while(|b| b.section == block.section)
            .find(|b| b.info == "sh" && b.code.iter().any(|l| l.contains("cargo add")))
            .map(|b| {
                b.code
                    .iter()
                    .map(|l| l.split(" #").next().unwrap().trim())
                    .filter(|l| l.starts_with("cargo add "))
                    .map(|l| {
                        l.split_whitespace()
                            .map(|w| w.trim_matches('"').to_owned())
                            .collect()
                    })
                    .collect()
            })
            .unwrap_or_default();
        if !adds.iter().any(|a: &Vec<String>| {
            a.get(2).map(String::as_str) == Some("--path")
                && a.get(3).map(String::as_str) == Some(FACADE)
        }) {
            problems.push(format!(
                "{name}: no `cargo add --path \"{FACADE}\" ...` line in an `sh` block before it, \
                 in its section: say which features and crates the example needs (by path: \
                 the crates are not in the public crate registry, where other projects hold similar names)"
            ));
            continue;
        }
        let redis = code.contains("REDIS_URL");
        let prints = blocks
            .get(i + 1)
            .filter(|b| b.info == "text" && b.section == block.section)
            .map(|b| b.code.join("\n") + "\n");
        if redis && prints.is_none() {
            problems.push(format!(
                "{name}: talks to Redis but its README shows no `text` block of what it prints \
                 right after it"
            ));
        }
        found.push(Example {
            name,
            code,
            adds,
            run: !block.info.split(',').any(|a| a.trim() == "no_run"),
            redis,
            prints,
        });
    }
    if problems.is_empty() {
        Ok(found)
    } else {
        Err(problems)
    }
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    // The nested builds must not pick up the outer build's settings.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "CARGO_MANIFEST_DIR",
    ] {
        c.env_remove(var);
    }
    c
}

/// Runs `cargo <args>` in `dir` offline first (against what the workspace's
/// build already fetched: fast, no network); when that fails because a
/// crate is not in the local cache (a README line that asks for features
/// the workspace does not use, say `cargo add axum` with its defaults),
/// again online, as a newcomer's cargo would.
fn offline_first(args: &[String], dir: &Path, target: Option<&Path>) -> std::process::Output {
    let run = |offline: bool| {
        let mut c = cargo();
        c.args(args).current_dir(dir);
        if offline {
            c.arg("--offline");
        }
        if let Some(target) = target {
            c.env("CARGO_TARGET_DIR", target);
        }
        c.output().expect("run cargo")
    };
    let out = run(true);
    if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("offline") {
        return out;
    }
    run(false)
}

fn shown(args: &[String]) -> String {
    args.join(" ")
}

/// Builds (and runs) one example in a new project under `dir`; on failure,
/// what to tell the reader.
fn build(example: &Example, dir: &Path, target: &Path, servers: &Servers) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        "[package]\nname = \"readme-example\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\
         publish = false\n\n[workspace]\n\n[dependencies]\n",
    )
    .unwrap();
    std::fs::write(dir.join("src/main.rs"), &example.code).unwrap();
    // The versions the workspace builds with (and has fetched).
    std::fs::copy(workspace().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let facade = workspace().join("ratelimit");
    let mut steps = Vec::new();
    for add in &example.adds {
        // `cargo add --path "$CHECKOUT/ratelimit" ...`: this checkout.
        let mut args: Vec<String> = add[1..].to_vec();
        if args.get(1).map(String::as_str) == Some("--path")
            && args.get(2).map(String::as_str) == Some(FACADE)
        {
            args[2] = facade.display().to_string();
        }
        steps.push(format!("cargo {}", shown(&args)));
        let out = offline_first(&args, dir, None);
        if !out.status.success() {
            return Err(format!(
                "`{}` failed:\n{}",
                shown(add),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    if example.redis {
        let out = offline_first(
            &["build".to_owned(), "--quiet".to_owned()],
            dir,
            Some(target),
        );
        if !out.status.success() {
            return Err(format!(
                "it does not build in a new project made with\n    {}\n{}",
                steps.join("\n    "),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let (single, cluster) = servers.fresh();
        let out = cargo()
            .args(["run", "--quiet", "--offline"])
            .current_dir(dir)
            .env("CARGO_TARGET_DIR", target)
            .env("REDIS_URL", &single)
            .env("REDIS_CLUSTER_URL", &cluster)
            .output()
            .expect("run cargo");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "it fails against a redis-server ({single}) and a cluster ({cluster}) started \
                 for it:\n{stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        return match &example.prints {
            Some(expected) if *expected != stdout => Err(format!(
                "against a fresh redis-server and cluster it prints\n{stdout}\nwhere its README \
                 says\n{expected}"
            )),
            _ => Ok(()),
        };
    }
    let verb = if example.run { "run" } else { "build" };
    let out = offline_first(&[verb.to_owned(), "--quiet".to_owned()], dir, Some(target));
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let hint = if stderr.contains("no matching package") || stderr.contains("failed to download") {
        "\n(cargo could not fetch a crate: is the crate registry reachable?)"
    } else {
        ""
    };
    Err(format!(
        "it does not {verb} in a new project made with\n    {}\n{stderr}{hint}",
        steps.join("\n    ")
    ))
}

/// The servers the examples that talk to Redis run against: a fresh
/// `redis-server` and a fresh Redis Cluster for each example, started
/// when one asks (and stopped with this value).
#[derive(Default)]
struct Servers {
    started: std::sync::Mutex<Vec<(RedisServer, RedisCluster)>>,
}

impl Servers {
    /// A fresh single node's URL and a fresh cluster's seed URL.
    fn fresh(&self) -> (String, String) {
        let (single, cluster) = (RedisServer::start_local(), RedisCluster::start_local());
        let urls = (single.url(), cluster.urls()[0].clone());
        self.started.lock().unwrap().push((single, cluster));
        urls
    }
}

#[test]
fn every_readme_example_builds_in_a_new_project_with_the_features_it_names() {
    let mut failures = Vec::new();
    let mut all = Vec::new();
    for readme in READMES {
        match examples(readme) {
            Ok(found) => {
                assert!(!found.is_empty(), "{readme} has no Rust example");
                all.extend(found);
            }
            Err(problems) => failures.extend(problems),
        }
    }
    assert!(
        failures.is_empty(),
        "README examples a newcomer cannot use as shown:\n\n{}",
        failures.join("\n\n")
    );
    let root = std::env::temp_dir().join(format!("ratelimit-readme-{}", std::process::id()));
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-examples");
    let servers = Servers::default();
    for (i, example) in all.iter().enumerate() {
        eprintln!("building {}", example.name);
        if let Err(e) = build(example, &root.join(i.to_string()), &target, &servers) {
            failures.push(format!("{}: {e}", example.name));
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    assert!(
        failures.is_empty(),
        "README examples that fail as a newcomer would build them:\n\n{}",
        failures.join("\n\n")
    );
}

#[test]
fn the_checks_catch_hidden_lines_and_missing_cargo_add_lines() {
    let text = "# Title\n\n## A\n\n```sh\ncargo add tokio\n```\n\n```rust\n# use std::fmt;\nlet x = 1;\n```\n\n\
                ## B\n\n```sh\ncargo add --path \"$CHECKOUT/ratelimit\" --features redis\n```\n\n```rust,no_run\n\
                fn main() {}\n```\n";
    let b = blocks(text);
    assert_eq!(b.len(), 4);
    assert_eq!((b[1].line, b[1].section.as_str()), (9, "## A"));
    assert!(is_rust(&b[1].info) && is_rust(&b[3].info) && !is_rust(&b[0].info));
    let dir = std::env::temp_dir().join(format!("ratelimit-readme-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("README.md");
    std::fs::write(&file, text).unwrap();
    let problems = examples(file.to_str().unwrap()).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains(":9 (## A), line 10: a hidden rustdoc line"));
    assert!(problems[1].contains(":9 (## A): no `fn main`"));
    assert!(
        problems[2].contains(":9 (## A): no `cargo add --path \"$CHECKOUT/ratelimit\" ...` line")
    );
}
