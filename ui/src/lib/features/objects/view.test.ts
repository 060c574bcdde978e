import { describe, expect, it } from 'vitest';
import { emptyView, formatView, parseView, toFilter, toggle, withFilter, type ObjectView } from './view';

describe('object view in the URL', () => {
  it('round-trips every field', () => {
    const v: ObjectView = {
      clusters: ['east', 'west'],
      namespaces: ['team-a-1'],
      kinds: ['Kustomization.kustomize.toolkit.fluxcd.io', 'Pod'],
      statuses: ['PROGRESSING', 'UNHEALTHY'],
      name: 'web & api',
      labels: 'app in (a,b),!canary',
      sort: 'UPDATED_AT',
      dir: 'DESC',
      first: 100,
      after: 'Y3Vyc29y==',
      page: 3,
    };
    expect(parseView(formatView(v))).toEqual(v);
  });

  it('leaves defaults out, so the empty view is the bare path', () => {
    expect(formatView(emptyView)).toBe('');
    expect(parseView('')).toEqual(emptyView);
  });

  it('is canonical: the same view gives the same URL whatever the order of its lists', () => {
    const a = formatView({ ...emptyView, clusters: ['west', 'east'] });
    const b = formatView({ ...emptyView, clusters: ['east', 'west'] });
    expect(a).toBe(b);
  });

  it('ignores garbage instead of failing', () => {
    const v = parseView('?status=BROKEN&status=unhealthy&sort=nope&dir=sideways&first=7&page=-2&cluster=');
    expect(v.statuses).toEqual(['UNHEALTHY']);
    expect(v.sort).toBe('NAME');
    expect(v.dir).toBe('ASC');
    expect(v.first).toBe(50);
    expect(v.page).toBe(1);
    expect(v.clusters).toEqual([]);
  });

  it('a page number without a cursor is the first page', () => {
    expect(parseView('?page=4').page).toBe(1);
  });

  it('a filter change goes back to the first page', () => {
    const v = withFilter({ ...emptyView, after: 'c', page: 2 }, { name: 'x' });
    expect(v.after).toBe('');
    expect(v.page).toBe(1);
    expect(v.name).toBe('x');
  });

  it('toggles facet values', () => {
    expect(toggle(['a'], 'b')).toEqual(['a', 'b']);
    expect(toggle(['a', 'b'], 'a')).toEqual(['b']);
  });

  it('builds the API filter from set fields only', () => {
    expect(toFilter(emptyView)).toEqual({});
    expect(toFilter({ ...emptyView, name: 'web', statuses: ['UNHEALTHY'] })).toEqual({ nameContains: 'web', statuses: ['UNHEALTHY'] });
  });
});
