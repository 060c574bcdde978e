import { defineConfig } from 'vite';
import { svelte } from '@sveltejs/vite-plugin-svelte';

// Two pages: the dashboard (index.html) and GraphiQL (graphiql.html). The
// output in dist/ is committed and embedded by the Go package ui, so the build
// must be deterministic: content-hashed names, no source maps, no timestamps.
export default defineConfig({
  plugins: [svelte()],
  base: '/',
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    assetsDir: 'assets',
    sourcemap: false,
    reportCompressedSize: false,
    chunkSizeWarningLimit: 4096,
    rollupOptions: {
      input: { index: 'index.html', graphiql: 'graphiql.html' },
      // GraphiQL's dependencies carry React's "use client" markers, which a
      // browser bundle ignores by design.
      onwarn(warning, warn) {
        if (warning.code === 'MODULE_LEVEL_DIRECTIVE') return;
        warn(warning);
      },
    },
  },
  test: {
    include: ['src/**/*.test.ts'],
    environment: 'node',
  },
});
