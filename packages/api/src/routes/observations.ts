import { type Observer, recordObservation } from "@mam/core";
import { operatorOrAgent, principalOf } from "../access.ts";
import { EXAMPLE } from "../examples.ts";
import { defineRoute, exampleProblem, jsonAnswer, jsonRequest } from "../openapi.ts";
import type { Principal } from "../tokens.ts";
import { JobPathSchema, ObservationAnswerSchema, ObservationRequest } from "../wire.ts";
import { actorOf, withHandler } from "./support.ts";

export const recordObservationRoute = withHandler(
  defineRoute(
    operatorOrAgent("observe", "job"),
    {
      operationId: "recordObservation",
      method: "post",
      path: "/v1/jobs/{job_id}/observations",
      tags: ["gate"],
      summary: "Record what a watcher or an agent hook saw of the job's latest dispatch",
      description:
        "Who recorded it is set from the token: a watcher token (the `observe` scope) records `watcher:<its name>` (unnamed: its id), the job's " +
        "agent token `agent:<the job's backend>` for its own attempt. mam records when it received it; an `observed_at` later than that by " +
        "more than `MAM_OBSERVATION_SKEW_SECONDS`, or before the dispatch's anchor, is a 400. A repeat of the source's last state is " +
        "coalesced into it (200, nothing bumped, no feed row); a new state is a 201 and a feed row `observation.recorded`. Past the source " +
        "class's bound for the attempt a new state is not stored: 429 `quota.observations`, and the attempt's evidence is marked overflowed " +
        "(the gate holds until the next dispatch). Every other refusal writes nothing.",
      request: {
        params: JobPathSchema,
        body: jsonRequest(ObservationRequest, {
          idlePane: { summary: "A watcher saw the pane idle", value: EXAMPLE.observationRequest },
        }),
      },
      responses: {
        201: jsonAnswer("A new observation, recorded.", ObservationAnswerSchema, {
          observation: EXAMPLE.observation,
          coalesced: false,
          evidence_seq: 4,
        }),
        200: jsonAnswer("A repeat of the source's last state, coalesced into it.", ObservationAnswerSchema, {
          observation: { ...EXAMPLE.observation, last_seen_received_at: "2026-11-20T10:05:45.020Z", sightings: 4 },
          coalesced: true,
          evidence_seq: 4,
        }),
      },
    },
    [
      404,
      exampleProblem(
        "observation.mismatch",
        "agent_session_uuid does not match attempt 1's recorded dispatch (another session's observation)",
        { issues: [{ path: "body.agent_session_uuid", message: "does not match the recorded dispatch" }] },
      ),
      exampleProblem(
        "quota.observations",
        "the agent sources of attempt 1 have recorded 64 observations, their bound: this state was not stored, and the attempt's evidence is marked overflowed (the gate holds until the next dispatch)",
      ),
    ],
  ),
  async (c) => {
    const { deps } = c.var.services;
    const principal = principalOf(c);
    const { source: _s, recorded_by: _r, received_at: _t, ...body } = c.req.valid("json");
    const recorded = await recordObservation(deps, c.req.valid("param").job_id, body, observerOf(principal), actorOf(principal));
    const answer = { observation: recorded.observation, coalesced: recorded.coalesced, evidence_seq: recorded.job.evidence_seq };
    return recorded.coalesced ? c.json(answer, 200) : c.json(answer, 201);
  },
);

/** Who records an observation, from the token alone. */
function observerOf(principal: Principal): Observer {
  if (principal.kind === "agent") return { kind: "agent", attempt: principal.attemptId };
  return { kind: "watcher", name: principal.name ?? principal.tokenId };
}
