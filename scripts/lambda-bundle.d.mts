import type { BuildOptions } from "esbuild";

export declare const ESM_REQUIRE_BANNER: string;
export declare const LAMBDA_ENTRIES: Readonly<Record<"http" | "stream-publisher" | "recovery-sweep", string>>;
export declare function lambdaBuildOptions(root: string, name: string, entry: string, outdir: string): BuildOptions & { metafile: true };
export declare const zodEnglishOnly: import("esbuild").Plugin;
