------------------------------ MODULE TwoPhase ------------------------------
(***************************************************************************)
(* Two-phase commit as Gray and Lamport specify it ("Consensus on          *)
(* Transaction Commit", 2004): one transaction manager (TM) and the        *)
(* resource managers RM.  RMs send "Prepared" spontaneously (the TM's      *)
(* "Prepare" requests are left out), and an RM that aborts sends nothing:  *)
(* the TM aborting on its own stands for receiving such a message.         *)
(* Messages are never removed from msgs, so receiving one is reading it.   *)
(*                                                                         *)
(* The readable Python model, checker/examples/two_phase_readable.py,      *)
(* mirrors this module variable for variable and action for action (the   *)
(* action classes of checker/examples/two_phase_commit.py carry these      *)
(* names; tests/checker/test_tla_spec.py checks that they agree).          *)
(* benchmarks/bench_tlc.py runs TLC on it beside invar-check on that       *)
(* model; TwoPhase.cfg is the configuration for 7 RMs.                     *)
(***************************************************************************)
CONSTANT RM            \* the resource managers

VARIABLES
  rmState,             \* rmState[r]: "working", "prepared", "committed" or "aborted"
  tmState,             \* "init", "committed" or "aborted"
  tmPrepared,          \* the RMs whose "Prepared" message the TM has received
  msgs                 \* every message sent so far

vars == <<rmState, tmState, tmPrepared, msgs>>

Message ==
  [type : {"Prepared"}, rm : RM] \cup [type : {"Commit", "Abort"}]

TPTypeOK ==
  /\ rmState \in [RM -> {"working", "prepared", "committed", "aborted"}]
  /\ tmState \in {"init", "committed", "aborted"}
  /\ tmPrepared \subseteq RM
  /\ msgs \subseteq Message

TPInit ==
  /\ rmState = [r \in RM |-> "working"]
  /\ tmState = "init"
  /\ tmPrepared = {}
  /\ msgs = {}
-----------------------------------------------------------------------------
(* The TM's actions *)

TMRcvPrepared(r) ==
  /\ tmState = "init"
  /\ [type |-> "Prepared", rm |-> r] \in msgs
  /\ tmPrepared' = tmPrepared \cup {r}
  /\ UNCHANGED <<rmState, tmState, msgs>>

TMCommit ==
  /\ tmState = "init"
  /\ tmPrepared = RM
  /\ tmState' = "committed"
  /\ msgs' = msgs \cup {[type |-> "Commit"]}
  /\ UNCHANGED <<rmState, tmPrepared>>

TMAbort ==
  /\ tmState = "init"
  /\ tmState' = "aborted"
  /\ msgs' = msgs \cup {[type |-> "Abort"]}
  /\ UNCHANGED <<rmState, tmPrepared>>

(* The RMs' actions *)

RMPrepare(r) ==
  /\ rmState[r] = "working"
  /\ rmState' = [rmState EXCEPT ![r] = "prepared"]
  /\ msgs' = msgs \cup {[type |-> "Prepared", rm |-> r]}
  /\ UNCHANGED <<tmState, tmPrepared>>

RMChooseToAbort(r) ==
  /\ rmState[r] = "working"
  /\ rmState' = [rmState EXCEPT ![r] = "aborted"]
  /\ UNCHANGED <<tmState, tmPrepared, msgs>>

RMRcvCommitMsg(r) ==
  /\ [type |-> "Commit"] \in msgs
  /\ rmState' = [rmState EXCEPT ![r] = "committed"]
  /\ UNCHANGED <<tmState, tmPrepared, msgs>>

RMRcvAbortMsg(r) ==
  /\ [type |-> "Abort"] \in msgs
  /\ rmState' = [rmState EXCEPT ![r] = "aborted"]
  /\ UNCHANGED <<tmState, tmPrepared, msgs>>

TPNext ==
  \/ TMCommit \/ TMAbort
  \/ \E r \in RM :
       \/ TMRcvPrepared(r) \/ RMPrepare(r) \/ RMChooseToAbort(r)
       \/ RMRcvCommitMsg(r) \/ RMRcvAbortMsg(r)

TPSpec == TPInit /\ [][TPNext]_vars
-----------------------------------------------------------------------------
(* The Python model's "consistent": no RM has committed while another has  *)
(* aborted (TCommit's TCConsistent, stated here on TwoPhase's variables).  *)
TCConsistent ==
  \A r1, r2 \in RM : ~ /\ rmState[r1] = "aborted"
                       /\ rmState[r2] = "committed"

THEOREM TPSpec => [](TPTypeOK /\ TCConsistent)
=============================================================================
