// The shapes of /work/notes/dashboard-contract.md, and the parts of a FleetRollout the page reads.
// Everything here comes from the cluster: render it as text only.
export const FINAL_PHASES = new Set(["Succeeded", "Failed", "Aborted", "RolledBack"]);
