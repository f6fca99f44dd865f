//! Which program a container runs. The kubelet has no container runtime: images it knows map to
//! programs on this machine (cdi-rs's own pod programs are subcommands of the `cdi` executable),
//! and a container of any other image runs its `command` on the host, as a process.

use std::collections::BTreeMap;

/// Image name (the last segment of the repository, no tag or digest) → the program's argv.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageMap {
    programs: BTreeMap<String, Vec<String>>,
}

/// `quay.io/kubevirt/cdi-importer:v1.60@sha256:…` → `cdi-importer`.
pub fn image_name(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    let last = image.rsplit('/').next().unwrap_or(image);
    last.split(':').next().unwrap_or(last)
}

impl ImageMap {
    /// Map `name` (see [`image_name`]) to `argv`.
    pub fn with(mut self, name: &str, argv: Vec<String>) -> ImageMap {
        self.programs.insert(name.into(), argv);
        self
    }

    /// `NAME=PROGRAM [ARGS…]`, words split on whitespace.
    pub fn parse_rule(rule: &str) -> Result<(String, Vec<String>), String> {
        let (name, program) = rule
            .split_once('=')
            .ok_or_else(|| format!("{rule:?}: expected NAME=PROGRAM [ARGS...]"))?;
        let argv: Vec<String> = program.split_whitespace().map(String::from).collect();
        if name.is_empty() || name.contains('/') || name.contains(':') || argv.is_empty() {
            return Err(format!(
                "{rule:?}: expected NAME=PROGRAM [ARGS...] where NAME is an image's last \
                 path segment without a tag, such as cdi-importer"
            ));
        }
        Ok((name.into(), argv))
    }

    pub fn program(&self, image: &str) -> Option<&[String]> {
        self.programs.get(image_name(image)).map(Vec::as_slice)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.programs.keys().map(String::as_str)
    }
}

/// Expand `$(VAR)` references to variables defined before, as Kubernetes does in `env` values,
/// `command` and `args`: `$$` is a literal `$`, unknown references stay as written.
pub fn expand(s: &str, vars: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match vars(name) {
                Some(v) => out.push_str(&v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The argv a container runs: a known image's program followed by the container's `args` (its
/// `command` names a path inside the image, so the mapping replaces it) — unless that command is
/// a program this machine has (`host_has`), such as KubeVirt's temporary pod's `/bin/bash`: then
/// it runs as given, like any container of an unknown image. An unknown image without a command
/// cannot run here.
pub fn argv(
    images: &ImageMap,
    image: &str,
    command: &[String],
    args: &[String],
    vars: &dyn Fn(&str) -> Option<String>,
    host_has: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>, String> {
    let expanded = |v: &[String]| v.iter().map(|a| expand(a, vars)).collect::<Vec<_>>();
    let runs_on_host = command.first().is_some_and(|c| host_has(c));
    if let Some(program) = images.program(image).filter(|_| !runs_on_host) {
        let mut argv = program.to_vec();
        argv.extend(expanded(args));
        return Ok(argv);
    }
    if command.is_empty() {
        let known: Vec<&str> = images.names().collect();
        return Err(format!(
            "image {image:?} is not one the cdi dev kubelet runs (it knows {}); give the \
             container a command to run on the host, or map the image to a program with \
             `cdi dev up --image NAME=PROGRAM`",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    }
    let mut argv = expanded(command);
    argv.extend(expanded(args));
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_images() {
        assert_eq!(
            image_name("quay.io/kubevirt/cdi-importer:v1.60.1"),
            "cdi-importer"
        );
        assert_eq!(image_name("localhost:5000/cdi-importer"), "cdi-importer");
        assert_eq!(image_name("cdi-importer@sha256:abcd"), "cdi-importer");
        assert_eq!(image_name("busybox"), "busybox");
    }

    #[test]
    fn rules() {
        assert_eq!(
            ImageMap::parse_rule("cdi-importer=/usr/bin/cdi importer").unwrap(),
            (
                "cdi-importer".to_string(),
                vec!["/usr/bin/cdi".to_string(), "importer".to_string()]
            )
        );
        for bad in ["cdi-importer", "=x", "a=", "quay.io/a=x", "a:1=x"] {
            assert!(ImageMap::parse_rule(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn expansion() {
        let vars = |k: &str| (k == "A").then(|| "1".to_string());
        assert_eq!(expand("x$(A)y", &vars), "x1y");
        assert_eq!(expand("$$(A) $(B) $ $(", &vars), "$(A) $(B) $ $(");
    }

    #[test]
    fn what_runs() {
        let images =
            ImageMap::default().with("cdi-importer", vec!["/bin/cdi".into(), "importer".into()]);
        let none = |_: &str| None;
        let host = |c: &str| c == "/bin/bash";
        let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(
            argv(
                &images,
                "quay.io/kubevirt/cdi-importer:v1",
                &s(&["/usr/bin/cdi-importer"]),
                &s(&["-v=1"]),
                &none,
                &host
            )
            .unwrap(),
            s(&["/bin/cdi", "importer", "-v=1"])
        );
        // KubeVirt's temporary pod.
        assert_eq!(
            argv(
                &images,
                "quay.io/kubevirt/virt-launcher:v1",
                &s(&["/bin/bash"]),
                &s(&["-c", "echo", "bound PVCs"]),
                &none,
                &host
            )
            .unwrap(),
            s(&["/bin/bash", "-c", "echo", "bound PVCs"])
        );
        // A known image whose command the host has runs that command.
        let mapped = images.clone().with(
            "virt-launcher",
            vec!["/bin/cdi".into(), "dev".into(), "launcher".into()],
        );
        assert_eq!(
            argv(
                &mapped,
                "quay.io/kubevirt/virt-launcher:v1",
                &s(&["/bin/bash"]),
                &s(&["-c", "true"]),
                &none,
                &host
            )
            .unwrap(),
            s(&["/bin/bash", "-c", "true"])
        );
        assert_eq!(
            argv(
                &mapped,
                "quay.io/kubevirt/virt-launcher:v1",
                &s(&["/usr/bin/virt-launcher-monitor"]),
                &s(&["--name", "vm"]),
                &none,
                &host
            )
            .unwrap(),
            s(&["/bin/cdi", "dev", "launcher", "--name", "vm"])
        );
        let err = argv(&images, "busybox", &[], &[], &none, &host).unwrap_err();
        assert!(
            err.contains("\"busybox\"") && err.contains("cdi-importer"),
            "{err}"
        );
    }
}
