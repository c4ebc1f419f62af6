"""Running MetaRoCE as a service: the systemd unit (`metaroce install --systemd`) and the
Prometheus exporter (`metaroce exporter`)."""
