// tests/browser/lib/browser.mjs: headless Chromium (Debian's package, or $CHROMIUM_PATH) driven by
// playwright-core, with the flags that keep it off the network (this machine's network is closed).
import { existsSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { REPO } from '../../http/lib/server.mjs';

export const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
export const WEB_ROOT = path.join(REPO, 'web/dist');

export async function launch() {
  if (!existsSync(CHROMIUM))
    throw new Error(`no Chromium at ${CHROMIUM}: install Debian's chromium (scripts/setup.sh) or set CHROMIUM_PATH`);
  if (!existsSync(path.join(WEB_ROOT, 'index.html')))
    throw new Error(`the playground is not built (${WEB_ROOT}): run ./scripts/build_web.sh`);
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync',
    ],
  });
}
