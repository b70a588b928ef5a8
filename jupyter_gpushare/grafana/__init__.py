"""The Grafana dashboard of the broker's Prometheus metrics (``jupyter-gpushare dashboard``).

:mod:`.panels` lists the panels and their PromQL (plain data, no dependency);
:mod:`.dashboard` builds the dashboard with Grafana's own grafana-foundation-sdk
(``pip install 'jupyter-gpushare[grafana]'``); :mod:`.command` is the subcommand.
"""
