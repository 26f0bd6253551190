// The shapes of /work/notes/dashboard-contract.md, and the parts of a FleetRollout the page reads.
// Everything here comes from the cluster: render it as text only.

export type WaitingKind =
  | "approval" | "analysis" | "window" | "budget" | "policy" | "paused"
  | "creator" | "rights" | "clusters" | "none";

export interface Counts {
  total: number; updated: number; healthy: number; failed: number; skipped: number; refused: number;
}

export interface Summary {
  namespace: string;
  name: string;
  uid: string;
  phase: string;
  image: string;
  /** 1-based; null before the first batch. */
  batch: number | null;
  totalBatches: number;
  totalTargets: number;
  counts: Counts;
  wave: string | null;
  waitingFor: { kind: WaitingKind; message: string };
  creator: string | null;
  createdAt: string;
  message: string | null;
}

/** One inbox entry; `batch` is 1-based like `kubectl fleetroll inbox` shows it. */
export interface Waiting {
  namespace: string; name: string; batch: number; batches: number;
  planHash: string; gatesHash: string; creator?: string | null; since: string;
}

export interface Connection { state: "live" | "reconnecting"; message?: string }
export interface Snapshot { scope: string; rollouts: Summary[] }

export type CellState = "pending" | "changing" | "soaking" | "healthy" | "failed" | "refused" | "skipped" | "restored";

export interface GridGroup { wave: string | null; cluster: string; batch: number; start: number; count: number }
/** `previousImages[i]`: target i's image before the rollout, as the plan froze it. */
export interface Grid { planHash: string; groups: GridGroup[]; targets: string[]; previousImages?: string[]; states: CellState[]; note?: string }

export interface TimelineEvent { time: string; type: string; reason: string; message: string; count?: number }

export interface Condition {
  type: string; status: string; reason?: string; message?: string; lastTransitionTime?: string;
}

export interface Measurement { at?: string; phase?: string; value?: string; message?: string }
export interface Metric {
  name: string; phase?: string; measurements?: Measurement[];
  successful?: number; failed?: number; inconclusive?: number; errors?: number; dryRun?: boolean;
}
export interface BatchStatus {
  index: number; state?: string; size?: number; startedAt?: string; finishedAt?: string;
  healthySince?: string; failed?: number;
  analysis?: { startedAt?: string; metrics?: Metric[]; hold?: { reason?: string; since?: string } | null } | null;
}
export interface Approvers { policy?: string; users?: string[]; groups?: string[]; more?: boolean }
export interface Failure {
  batch?: number; cluster?: string; namespace?: string; name?: string; reason?: string; message?: string;
}

export interface RolloutStatus {
  phase?: string;
  message?: string;
  reason?: string;
  currentBatch?: number;
  conditions?: Condition[];
  batches?: BatchStatus[];
  failures?: Failure[];
  pendingApproval?: {
    batch: number; planHash: string; gatesHash: string; since?: string; approvers?: Approvers[];
  } | null;
  windowHold?: {
    kind?: string; owner?: string; window?: string; opensAt?: string; invalid?: string;
  } | null;
  policyHold?: { policy?: string; rule?: string; message?: string } | null;
  rightsHold?: { batch?: number; message?: string } | null;
  creatorHold?: string | null;
  rollback?: { state?: string; reason?: string; restored?: number; skipped?: number } | null;
  clusters?: { trouble?: { name: string; reason?: string; message?: string }[] } | null;
}

export interface FleetRollout {
  metadata: { namespace?: string; name?: string; creationTimestamp?: string };
  spec: { image?: string; paused?: boolean; abort?: boolean; rollback?: boolean };
  status?: RolloutStatus | null;
}

export interface RolloutEvent { summary: Summary; object: FleetRollout; mayApprove: boolean }

export interface PlanPreview {
  planHash: string; totalTargets: number;
  batches: { index: number; wave: string | null; targets: string[] }[];
  notes?: string[];
}

export type Action = "approve" | "pause" | "resume" | "abort" | "rollback";

export const FINAL_PHASES: ReadonlySet<string> = new Set(["Succeeded", "Failed", "Aborted", "RolledBack"]);
