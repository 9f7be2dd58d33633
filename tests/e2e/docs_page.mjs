// Swagger UI at /docs in headless Chromium, as an operator uses it: "Try it out" on one GET and one POST.
// Prints one JSON line: for each call, the URL the page called, the status it got and the status it shows.
// Usage: node tests/e2e/docs_page.mjs API_URL CHROMIUM_PATH POST_BODY
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const [api, executablePath, postBody] = process.argv.slice(2);
const GET = 'operations-workers-list_workers_api_v1_workers_get';
const POST = 'operations-workers-create_worker_api_v1_workers_post';
// No sandbox (CI runs as root), and nothing that reaches outside this machine.
const FLAGS = [
  '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
  '--disable-component-update', '--disable-sync',
];

async function tryItOut(page, id, body) {
  const operation = page.locator(`#${id}`);
  await operation.locator('.opblock-summary').first().click();
  await operation.locator('button.try-out__btn').click();
  if (body !== undefined) {
    await operation.locator('textarea.body-param__text').fill(body);
  }
  const [response] = await Promise.all([
    page.waitForResponse((r) => ['fetch', 'xhr'].includes(r.request().resourceType())),
    operation.locator('button.execute').click(),
  ]);
  const shown = operation.locator('.live-responses-table .response .response-col_status').first();
  return {
    method: response.request().method(),
    url: response.url(),
    status: response.status(),
    shown: (await shown.innerText()).trim(),
  };
}

const profile = mkdtempSync(join(tmpdir(), 'fleetkeeper-docs-'));
const context = await chromium.launchPersistentContext(profile, { executablePath, headless: true, args: FLAGS });
try {
  context.setDefaultTimeout(30_000);
  const page = await context.newPage();
  await page.goto(`${api}/docs`);
  const get = await tryItOut(page, GET);
  const post = await tryItOut(page, POST, postBody);
  console.log(JSON.stringify({ get, post }));
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
