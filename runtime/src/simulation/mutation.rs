//! Mutants of the production Lua scripts, for measuring the simulation's strength: the simulated server can run
//! a script with one comparison flipped (`==` ↔ `~=`, `<` ↔ `>=`, `>` ↔ `<=`), while the client sends the
//! script unchanged. Nothing in the engine knows: the mutant lives in the simulated server alone.

/// One Lua mutant: the `index`-th comparison of every script line reading `line`, flipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuaMutant {
    /// The script line (as in its `.lua` file, indentation included).
    pub line: String,
    /// Which comparison of the line.
    pub index: usize,
    /// The comparison flipped, and what it becomes.
    pub operator: &'static str,
    pub replacement: &'static str,
}

impl LuaMutant {
    /// The line as the mutant has it.
    pub fn mutated_line(&self) -> String {
        mutant(&self.line, self.index).unwrap_or_else(|| self.line.clone())
    }

    /// `source` with every line equal to this mutant's line mutated.
    pub(crate) fn apply(&self, source: &str) -> String {
        let mutated = self.mutated_line();
        source.split('\n').map(|l| if l == self.line { mutated.as_str() } else { l }).collect::<Vec<_>>().join("\n")
    }
}

/// Every Lua mutant of the production scripts: each comparison of each distinct script line (a line shared by
/// several scripts, from a file they include, is one mutant of that file).
pub fn lua_mutants() -> Vec<LuaMutant> {
    let mut lines: Vec<&str> =
        crate::backend::script_sources().into_iter().flat_map(|(_, source)| source.lines()).collect();
    lines.sort_unstable();
    lines.dedup();
    let mut mutants = Vec::new();
    for line in lines {
        for (index, comparison) in comparisons(line).into_iter().enumerate() {
            mutants.push(LuaMutant {
                line: line.to_owned(),
                index,
                operator: comparison.operator,
                replacement: flipped(comparison.operator),
            });
        }
    }
    mutants
}

/// A comparison in a script's source: where it starts and the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Comparison {
    pub(crate) at: usize,
    pub(crate) operator: &'static str,
}

/// The comparisons of `source`, in order, outside comments and string literals.
pub(crate) fn comparisons(source: &str) -> Vec<Comparison> {
    let bytes = source.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                // A comment, to the end of its line.
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            quote @ (b'\'' | b'"') => {
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'=' | b'~' | b'<' | b'>' => {
                let two = bytes.get(i + 1) == Some(&b'=');
                let operator = match (bytes[i], two) {
                    (b'=', true) => Some("=="),
                    (b'~', true) => Some("~="),
                    (b'<', true) => Some("<="),
                    (b'>', true) => Some(">="),
                    (b'<', false) => Some("<"),
                    (b'>', false) => Some(">"),
                    _ => None,
                };
                if let Some(operator) = operator {
                    found.push(Comparison { at: i, operator });
                }
                i += if two { 2 } else { 1 };
            }
            _ => i += 1,
        }
    }
    found
}

/// The opposite comparison.
pub(crate) fn flipped(operator: &str) -> &'static str {
    match operator {
        "==" => "~=",
        "~=" => "==",
        "<" => ">=",
        ">=" => "<",
        ">" => "<=",
        _ => ">",
    }
}

/// `source` with its `index`-th comparison flipped, or `None` if it has fewer.
pub(crate) fn mutant(source: &str, index: usize) -> Option<String> {
    let comparison = *comparisons(source).get(index)?;
    let mut out = String::with_capacity(source.len() + 1);
    out.push_str(&source[..comparison.at]);
    out.push_str(flipped(comparison.operator));
    out.push_str(&source[comparison.at + comparison.operator.len()..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_comparisons_outside_comments_and_strings() {
        let source = "-- a < b\nif x == 1 and y ~= '<=' then return a<=b or c > d end";
        let found: Vec<&str> = comparisons(source).iter().map(|c| c.operator).collect();
        assert_eq!(found, ["==", "~=", "<=", ">"]);
        assert_eq!(
            mutant(source, 2).as_deref(),
            Some("-- a < b\nif x == 1 and y ~= '<=' then return a>b or c > d end")
        );
        assert_eq!(mutant(source, 4), None);
    }

    #[test]
    fn an_assignment_is_no_comparison() {
        assert!(comparisons("local a = 1").is_empty());
    }
}
