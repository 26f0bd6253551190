//! The operator's words for an exec policy: `--member-exec-args` entries (`COMMAND [SUBCOMMAND...]=FLAG,...`)
//! and `--member-exec-env` entries (`COMMAND=VARIABLE,...`), each flag or variable with the values it may
//! take (`--tenant-id|-t={id}`, `--login=spn|msi`, `--federated-token-file=/var/run/secrets/azure/token`).

use std::str::FromStr;

/// The values a flag or a variable may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `{switch}`: a flag given alone or as `--flag=true|false` (it takes no next argument); a variable
    /// set to `true` or `false`.
    Switch,
    /// `{id}` (and a flag or variable given with no values): a name such as a cluster, profile, project or
    /// tenant: a letter or digit, then letters, digits, `.`, `_` and `-`; at most 128 bytes. Never a path
    /// or a URL.
    Id,
    /// `{guid}`: 8-4-4-4-12 hexadecimal digits (an Azure client or tenant ID).
    Guid,
    /// `{arn}`: an IAM role's ARN (`arn:aws:iam::123456789012:role/deployer`).
    Arn,
    /// `{region}`: an AWS region (`eu-west-1`, `us-gov-east-1`).
    Region,
    /// `{secret}`: printable ASCII without spaces, at most 1024 bytes (a client secret; never shown).
    Secret,
    /// Exactly this value: one of an enumeration, or the one file or URL the operator allows.
    Literal(String),
}

/// The classes of values, by the name an entry gives them in braces.
const CLASSES: [(&str, Kind); 6] = [
    ("switch", Kind::Switch),
    ("id", Kind::Id),
    ("guid", Kind::Guid),
    ("arn", Kind::Arn),
    ("region", Kind::Region),
    ("secret", Kind::Secret),
];

impl Kind {
    /// Whether `value` is one this kind takes (a switch's, as a variable or after `=`).
    pub fn admits(&self, value: &str) -> bool {
        match self {
            Kind::Switch => value == "true" || value == "false",
            Kind::Id => {
                value.len() <= 128
                    && value.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                    && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            }
            Kind::Guid => {
                let groups: Vec<&str> = value.split('-').collect();
                groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
                    && groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
            }
            Kind::Arn => arn(value),
            Kind::Region => region(value),
            Kind::Secret => (1..=1024).contains(&value.len()) && value.bytes().all(|b| b.is_ascii_graphic()),
            Kind::Literal(l) => l == value,
        }
    }

    /// What values of this kind are, for refusals (a literal is not shown: it may be a path).
    pub fn describe(&self) -> &'static str {
        match self {
            Kind::Switch => "true or false",
            Kind::Id => "a name (letters, digits, '.', '_', '-')",
            Kind::Guid => "a GUID",
            Kind::Arn => "an IAM role ARN",
            Kind::Region => "an AWS region",
            Kind::Secret => "printable ASCII without spaces",
            Kind::Literal(_) => "one of the values allowed",
        }
    }
}

/// `arn:PARTITION:iam::ACCOUNT:role/PATH-AND-NAME`, as IAM spells role ARNs.
fn arn(value: &str) -> bool {
    let Some(rest) = value.strip_prefix("arn:") else { return false };
    let parts: Vec<&str> = rest.splitn(5, ':').collect();
    let [partition, "iam", "", account, resource] = parts.as_slice() else { return false };
    let name = resource.strip_prefix("role/").unwrap_or_default();
    partition.starts_with("aws")
        && partition.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
        && account.len() == 12
        && account.bytes().all(|b| b.is_ascii_digit())
        && (1..=512).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"+=,.@_/-".contains(&b))
}

/// `xx-name-N`: two letters, words, and a number (`eu-west-1`, `us-gov-east-1`).
fn region(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let lower = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase());
    match parts.as_slice() {
        [area, words @ .., number] if !words.is_empty() => {
            area.len() == 2
                && lower(area)
                && words.iter().all(lower)
                && (1..=2).contains(&number.len())
                && number.bytes().all(|b| b.is_ascii_digit())
        }
        _ => false,
    }
}

/// A flag or variable as an entry declares it: its names (a flag's aliases) and the values it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub names: Vec<String>,
    pub kinds: Vec<Kind>,
}

/// One `--member-exec-args` entry: `COMMAND [SUBCOMMAND...]=FLAG[=VALUES],...`, where a flag is its names
/// (`--tenant-id|-t`) and its values are `|`-separated classes in braces (`{guid}`) or literal values
/// (`spn|msi`); a flag given no values takes `{id}`. `kubelogin get-token=` allows the subcommand with no
/// flag. The empty entry allows nothing (`--member-exec-args=""`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArgsEntry {
    pub command: String,
    pub path: Vec<String>,
    pub flags: Vec<Declared>,
}

/// One `--member-exec-env` entry: `COMMAND=VARIABLE[=VALUES],...`, values as in [`ArgsEntry`]. The empty
/// entry allows nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvEntry {
    pub command: String,
    pub vars: Vec<Declared>,
}

impl FromStr for ArgsEntry {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let Some((head, specs)) = split_entry(s)? else { return Ok(Self::default()) };
        let mut words = head.split(' ').filter(|w| !w.is_empty());
        let command = words.next().ok_or_else(|| format!("{s:?} names no command before '='"))?;
        let path: Vec<String> = words.map(str::to_string).collect();
        if let Some(w) = path.iter().find(|w| !word(w)) {
            return Err(format!("{s:?}: subcommand {w:?} is not a word (letters, digits, '.', '_', '-')"));
        }
        let flags = declarations(specs, |n| flag_name(n).then_some(()).ok_or("is not a flag (--name or -n)"))
            .map_err(|e| format!("{s:?}: {e}"))?;
        Ok(Self { command: command.to_string(), path, flags })
    }
}

impl FromStr for EnvEntry {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let Some((command, specs)) = split_entry(s)? else { return Ok(Self::default()) };
        let command = command.trim();
        if command.is_empty() || command.contains(' ') {
            return Err(format!("{s:?} names no command before '=' (one command, no spaces)"));
        }
        let vars = declarations(specs, variable_name).map_err(|e| format!("{s:?}: {e}"))?;
        Ok(Self { command: command.to_string(), vars })
    }
}

/// `COMMAND...` and the declarations after the first '=', or None for the empty entry.
fn split_entry(s: &str) -> Result<Option<(&str, &str)>, String> {
    if s.trim().is_empty() {
        return Ok(None);
    }
    if s.chars().any(char::is_control) {
        return Err(format!("{s:?} holds a control character"));
    }
    s.split_once('=').map(Some).ok_or_else(|| format!("{s:?} is not COMMAND=...: no '='"))
}

/// The comma-separated declarations `NAMES[=VALUES]`, each name checked by `name`.
fn declarations(
    specs: &str,
    name: impl Fn(&str) -> Result<(), &'static str>,
) -> Result<Vec<Declared>, String> {
    let mut out = Vec::new();
    for spec in specs.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (names, values) = match spec.split_once('=') {
            Some((names, values)) => (names, Some(values)),
            None => (spec, None),
        };
        let names: Vec<String> = names.split('|').map(|n| n.trim().to_string()).collect();
        for n in &names {
            name(n).map_err(|why| format!("{n:?} {why}"))?;
        }
        let kinds = match values {
            None => vec![Kind::Id],
            Some(values) => values.split('|').map(kind).collect::<Result<_, _>>()?,
        };
        if kinds.contains(&Kind::Switch) && kinds.len() > 1 {
            return Err(format!("{spec:?} is a {{switch}} or takes values, not both"));
        }
        out.push(Declared { names, kinds });
    }
    Ok(out)
}

fn kind(value: &str) -> Result<Kind, String> {
    match value.strip_prefix('{').and_then(|v| v.strip_suffix('}')) {
        Some(class) => CLASSES.iter().find(|(n, _)| *n == class).map(|(_, k)| k.clone()).ok_or_else(|| {
            let known: Vec<String> = CLASSES.iter().map(|(n, _)| format!("{{{n}}}")).collect();
            format!("{value:?} is not one of {}", known.join(", "))
        }),
        None if value.is_empty() => Err("an empty value is never allowed".into()),
        None => Ok(Kind::Literal(value.to_string())),
    }
}

/// A subcommand: a letter or digit, then letters, digits, '.', '_', '-'.
fn word(w: &str) -> bool {
    Kind::Id.admits(w)
}

/// `--name` or `-n` (any number of dashes, then a word).
fn flag_name(n: &str) -> bool {
    let bare = n.trim_start_matches('-');
    n.len() - bare.len() <= 2 && n.starts_with('-') && word(bare)
}

/// An environment variable's name: letters, digits and '_', not starting with a digit; never one that
/// chooses which program runs or what it loads.
fn variable_name(n: &str) -> Result<(), &'static str> {
    let fine = n.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    match (fine, is_loader_variable(n)) {
        (false, _) => Err("is not a variable name (letters, digits, '_'; no '*')"),
        (_, true) => Err("chooses which program runs or what it loads: never allowed"),
        _ => Ok(()),
    }
}

/// Environment variables that decide which program a bare command name runs, or what the dynamic loader
/// puts into it: refused whatever the operator allows.
pub fn is_loader_variable(name: &str) -> bool {
    name == "PATH" || name.starts_with("LD_") || name.starts_with("DYLD_") || name == "GCONV_PATH"
}
