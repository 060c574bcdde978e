import { describe, expect, it } from 'vitest';
import type { Client } from '../../graphql/client';
import { csvField, fetchAll, toCSV, type ExportRow } from './csv';
import { emptyView } from './view';

const row = (name: string, extra: Partial<ExportRow> = {}): ExportRow => ({
  cluster: 'east',
  namespace: 'team-a',
  kind: 'Pod',
  group: '',
  name,
  status: 'HEALTHY',
  message: null,
  createdAt: '2026-01-01T00:00:00Z',
  updatedAt: null,
  labels: [],
  ...extra,
});

describe('csv', () => {
  it('quotes what needs quoting', () => {
    expect(csvField('plain')).toBe('plain');
    expect(csvField('a,b')).toBe('"a,b"');
    expect(csvField('say "hi"')).toBe('"say ""hi"""');
    expect(csvField('two\nlines')).toBe('"two\nlines"');
  });

  it('writes a header and one line per object', () => {
    const out = toCSV([row('web', { message: 'Back-off, restarting', labels: [{ key: 'app', value: 'web' }, { key: 'tier', value: 'fe' }] })]);
    expect(out).toBe(
      'cluster,namespace,kind,group,name,status,message,createdAt,updatedAt,labels\r\n' +
        'east,team-a,Pod,,web,HEALTHY,"Back-off, restarting",2026-01-01T00:00:00Z,,app=web;tier=fe\r\n',
    );
  });

  it('reads every page', async () => {
    const pages = [
      { edges: [row('a'), row('b')], next: 'c1' },
      { edges: [row('c')], next: null },
    ];
    const seen: unknown[] = [];
    const client = {
      query: async (_q: string, vars: Record<string, unknown>) => {
        seen.push(vars.after);
        const p = pages[seen.length - 1];
        return { objects: { pageInfo: { hasNextPage: p.next !== null, endCursor: p.next }, edges: p.edges.map((node) => ({ node })) } };
      },
    } as unknown as Client;
    const rows = await fetchAll(client, emptyView);
    expect(rows.map((r) => r.name)).toEqual(['a', 'b', 'c']);
    expect(seen).toEqual([null, 'c1']);
  });
});
