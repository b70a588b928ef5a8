import { LabIcon } from '@jupyterlab/ui-components';

const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
<g class="jp-icon3" fill="#616161"><path d="M3 6h15a3 3 0 0 1 3 3v6a3 3 0 0 1-3 3H9v2H7v-2H5v2H3z
M5 8v8h13a1 1 0 0 0 1-1V9a1 1 0 0 0-1-1zm8 1.5a2.5 2.5 0 1 1 0 5 2.5 2.5 0 0 1 0-5z"/></g></svg>`;

export const gpuIcon = new LabIcon({ name: 'jupyter-gpushare:gpu', svgstr: svg });

const jobsSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
<g class="jp-icon3" fill="#616161"><path d="M4 4h16v4H4zm0 6h16v4H4zm0 6h10v4H4zm13 0 5 3-5 3z"/></g></svg>`;

export const jobsIcon = new LabIcon({ name: 'jupyter-gpushare:jobs', svgstr: jobsSvg });
