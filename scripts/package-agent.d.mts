export declare const AGENT_INSTALL_REFUSAL: string;
export interface PackedAgent {
  /** The tarball's absolute path: `<outDir>/mam-agent-<version>.tgz`. */
  readonly tarball: string;
  readonly tarballBytes: number;
  /** The files in the tarball, relative to its package root. */
  readonly files: readonly string[];
  /** What every command loads: `lib/main.mjs` and the chunks it imports statically. */
  readonly loadedBytes: number;
  /** The chunks loaded on first use only (dynamic imports: @mam/api for `token create`, the refusing module). */
  readonly lazyBytes: number;
}
export declare function packAgent(opts?: { readonly outDir?: string }): Promise<PackedAgent>;
