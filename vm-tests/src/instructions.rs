//! The commands the product tells a person to run, read from where it tells them: spans in backticks or single
//! quotes and the lines of fenced code blocks (a line ending in `<<'EOF'` together with its here-document; docs,
//! alert texts, status messages, maintainer scripts), whose first word is one of the commands asked for. The tests
//! run each where the person is told to run it (on the device:
//! `tests/package.rs`; in the cluster: `tests/demo_guardrails.rs`).

/// Every command in the files `sources` (paths in the workspace) whose first word is one of `commands`, after a
/// leading `sudo `, `env ` and `VAR=value` words; (source, command), sorted, without repeats. Rust string
/// continuations (`"…\` + newline + `   …"`) are joined into one line first.
pub fn printed<S: AsRef<str>>(sources: &[S], commands: &[&str]) -> Vec<(String, String)> {
    let root = fleet_rig::util::workspace_root();
    let mut out = Vec::new();
    for src in sources {
        let src = src.as_ref();
        let text = std::fs::read_to_string(root.join(src)).unwrap_or_else(|e| panic!("{src}: {e}"));
        let text = text
            .split("\\\n")
            .map(|p| p.trim_start())
            .collect::<Vec<_>>()
            .join("");
        let mut spans: Vec<String> = Vec::new();
        for quote in ['`', '\''] {
            for line in text.lines() {
                spans.extend(line.split(quote).skip(1).step_by(2).map(str::to_owned));
            }
        }
        let mut fenced = false;
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            } else if fenced && line.trim_end().ends_with("<<'EOF'") {
                // A here-document: the command with its lines up to `EOF`, run as one.
                let mut command = line.trim().to_owned();
                for body in lines.by_ref() {
                    command.push('\n');
                    command.push_str(body);
                    if body.trim() == "EOF" {
                        break;
                    }
                }
                spans.push(command);
            } else if fenced {
                spans.push(line.split('#').next().unwrap_or_default().trim().to_owned());
            }
        }
        for span in spans {
            let span = span
                .trim()
                .trim_start_matches("sudo ")
                .trim_start_matches("env ")
                .to_string();
            // The command line is normalised; a here-document's lines stay as written.
            let (first, heredoc) = span.split_once('\n').unwrap_or((&span, ""));
            let mut span = first
                .split_whitespace()
                .skip_while(|w| w.contains('=') && !w.starts_with('-'))
                .collect::<Vec<_>>()
                .join(" ");
            if !heredoc.is_empty() {
                span.push('\n');
                span.push_str(heredoc);
            }
            if span
                .split_whitespace()
                .next()
                .is_some_and(|w| commands.contains(&w))
            {
                out.push((src.to_owned(), span));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The files under `dir` (relative to the workspace) whose names end in `ext`, recursively, as workspace paths.
pub fn files(dir: &str, ext: &str) -> Vec<String> {
    let root = fleet_rig::util::workspace_root();
    let mut out = Vec::new();
    let mut todo = vec![root.join(dir)];
    while let Some(d) = todo.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.to_string_lossy().ends_with(ext) {
                if let Ok(rel) = p.strip_prefix(&root) {
                    out.push(rel.display().to_string());
                }
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    /// A here-document in a fenced block is one command with its lines; docs/diagnostics.md's examples are found so.
    #[test]
    fn a_here_document_is_one_command() {
        let found = super::printed(&["docs/diagnostics.md"], &["kubectl"]);
        let apply: Vec<&String> = found
            .iter()
            .map(|(_, c)| c)
            .filter(|c| c.starts_with("kubectl apply -f - <<'EOF'\n"))
            .collect();
        assert_eq!(apply.len(), 2, "{found:#?}");
        assert!(apply
            .iter()
            .all(|c| c.ends_with("\nEOF") && c.contains("\nkind: ")));
        assert!(found
            .iter()
            .any(|(_, c)| c.starts_with("kubectl get fdiag demo-1-disk -o jsonpath=")));
    }

    /// The example Prometheus rules print their device commands in backticks, so the tests that run every printed
    /// command (`tests/package.rs` on the device, `tests/demo_guardrails.rs` in the cluster) run theirs too.
    #[test]
    fn the_rules_file_prints_its_commands() {
        let rules = ["docs/dashboard/prometheus-rules.yaml"];
        let device = super::printed(&rules, &["fleet-device-setup", "journalctl", "systemctl"]);
        let device: Vec<&str> = device.iter().map(|(_, c)| c.as_str()).collect();
        assert_eq!(
            device,
            [
                "fleet-device-setup --repair-rollback-failed",
                "journalctl -u fleet-agent",
                "journalctl -u fleet-updater",
                "systemctl status fleet-updater",
            ]
        );
        let cluster = super::printed(&rules, &["kubectl"]);
        assert_eq!(
            cluster,
            [
                (rules[0].to_owned(), "kubectl get fdev".to_owned()),
                (rules[0].to_owned(), "kubectl get fdev -o wide".to_owned())
            ]
        );
    }
}
