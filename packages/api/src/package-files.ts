/**
 * Files the app serves from an npm package found beside it (swagger-ui-dist for the
 * docs page, @mam/dashboard's dist/ for the dashboard): looked up lazily, on the
 * first request, through node:module and node:fs, so no bundle imports them and an
 * app whose package is absent still starts (the route answers 404 instead).
 */

/** The directory of `pkg` (resolved from this module), or undefined where it is not installed. */
export async function packageDir(pkg: string): Promise<string | undefined> {
  try {
    const { createRequire } = await import("node:module");
    const { dirname } = await import("node:path");
    return dirname(createRequire(import.meta.url).resolve(`${pkg}/package.json`));
  } catch {
    return undefined;
  }
}

/** The bytes of `name` under `dir`, or undefined when it cannot be read. */
export async function readFileIn(dir: string, name: string): Promise<Uint8Array<ArrayBuffer> | undefined> {
  try {
    const { readFile } = await import("node:fs/promises");
    const { join } = await import("node:path");
    return new Uint8Array(await readFile(join(dir, name)));
  } catch {
    return undefined;
  }
}
