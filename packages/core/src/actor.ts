/** Who is asking. The engine's table says which actor may do what. */
export type Actor =
  | { readonly kind: "operator"; readonly id?: string }
  | { readonly kind: "agent"; readonly jobId: string; readonly attemptId: number; readonly tokenId?: string };

export const OPERATOR: Actor = { kind: "operator" };
