"""The host application: service process, REST API and CLI. It composes the SDK (nms.records,
nms.config, nms.store, nms.state) with plugins found through entry points (nms.app.plugins)."""
