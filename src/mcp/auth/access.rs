//! Access decisions: which FleetRollout permission each request needs, and whether what the middleware
//! granted covers the operation the handler is about to perform.

use serde_json::Value;

use crate::mcp::{task::TaskId, tools::FleetTool};

/// A FleetRollout verb, as RBAC names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    Create,
    Get,
    List,
    Patch,
    /// Adding an approval: a verb of its own, which the built-in edit role does not carry.
    Approve,
    /// Approving a rollout one created oneself (separation of duties forbids it unless granted).
    SelfApprove,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Create => "create",
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Patch => "patch",
            Verb::Approve => "approve",
            Verb::SelfApprove => "self-approve",
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A FleetRollout permission an operation needs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    pub verb: Verb,
    /// None: all namespaces.
    pub namespace: Option<String>,
    pub name: Option<String>,
}

/// What the request was authorized for; put in the request's extensions by the middleware.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Granted {
    /// `--auth none`: everything.
    All,
    /// Exactly this permission (or nothing, when the operation needs none).
    Only(Option<Access>),
}

impl Granted {
    pub fn allows(&self, access: &Access) -> bool {
        match self {
            Granted::All => true,
            Granted::Only(Some(granted)) => granted == access,
            Granted::Only(None) => false,
        }
    }
}

/// The permission a JSON-RPC request needs, from its method and params. None: being authenticated is
/// enough (discovery, listing tools, notifications), or the request names nothing it could be checked
/// against (an unknown tool or a malformed task id, which the handler refuses).
pub fn required_access(method: &str, params: &Value) -> Option<Access> {
    match method {
        "tools/call" => {
            let tool = FleetTool::parse(params.get("name").and_then(Value::as_str)?)?;
            Some(tool.access(params.get("arguments").unwrap_or(&Value::Null)))
        }
        "tasks/get" | "tasks/update" | "tasks/cancel" => {
            let id = TaskId::parse(params.get("taskId").and_then(Value::as_str)?)?;
            // tasks/update answers the approval form, so it needs what approve_batch needs.
            let verb = match method {
                "tasks/get" => Verb::Get,
                "tasks/update" => Verb::Approve,
                _ => Verb::Patch,
            };
            Some(Access { verb, namespace: Some(id.namespace), name: Some(id.name) })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool_access(tool: &str, args: &Value) -> Option<Access> {
        required_access("tools/call", &json!({"name": tool, "arguments": args}))
    }

    #[test]
    fn each_tool_needs_the_verb_it_uses() {
        let args = json!({"namespace": "team", "name": "web"});
        let access = |tool| tool_access(tool, &args).unwrap();
        assert_eq!(
            access("rollout_fleet"),
            Access { verb: Verb::Create, namespace: Some("team".into()), name: None }
        );
        assert_eq!(access("preview_rollout").verb, Verb::Create);
        assert_eq!(
            access("get_rollout"),
            Access { verb: Verb::Get, namespace: Some("team".into()), name: Some("web".into()) }
        );
        assert_eq!(
            access("list_rollouts"),
            Access { verb: Verb::List, namespace: Some("team".into()), name: None }
        );
        assert_eq!(
            access("approve_batch"),
            Access { verb: Verb::Approve, namespace: Some("team".into()), name: Some("web".into()) }
        );
        for tool in ["pause_rollout", "resume_rollout", "abort_rollout", "rollback_rollout"] {
            assert_eq!(
                access(tool),
                Access { verb: Verb::Patch, namespace: Some("team".into()), name: Some("web".into()) }
            );
        }
        assert_eq!(tool_access("greet", &args), None);
        assert_eq!(tool_access("list_rollouts", &json!({})).unwrap().namespace, None, "all namespaces");
    }

    #[test]
    fn task_methods_need_access_to_the_rollout_they_name() {
        let id = "team/web/0123456789abcdef0123456789abcdef";
        let get = required_access("tasks/get", &json!({"taskId": id})).unwrap();
        assert_eq!(get, Access { verb: Verb::Get, namespace: Some("team".into()), name: Some("web".into()) });
        assert_eq!(required_access("tasks/cancel", &json!({"taskId": id})).unwrap().verb, Verb::Patch);
        assert_eq!(required_access("tasks/update", &json!({"taskId": id})).unwrap().verb, Verb::Approve);
        assert_eq!(required_access("tasks/get", &json!({"taskId": "nonsense"})), None);
        assert_eq!(required_access("tools/list", &json!({})), None);
        assert_eq!(required_access("server/discover", &Value::Null), None);
    }

    #[test]
    fn a_grant_covers_exactly_what_was_reviewed() {
        let a = Access { verb: Verb::Get, namespace: Some("team".into()), name: Some("web".into()) };
        let b = Access { verb: Verb::Patch, ..a.clone() };
        assert!(Granted::All.allows(&b));
        assert!(Granted::Only(Some(a.clone())).allows(&a));
        assert!(!Granted::Only(Some(a)).allows(&b));
        assert!(!Granted::Only(None).allows(&b));
    }
}
