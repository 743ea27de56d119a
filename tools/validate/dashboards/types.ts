// Types the dashboard check (check-dashboards.mjs) gives each dashboard and
// each panel's options. The @grafana/schema types use TypeScript enums
// (FieldColorModeId, BigValueColorMode, ...), which a JSON literal can never
// satisfy: Json<T> is T with every string enum replaced by the union of its
// values, and is otherwise the same type (required keys, excess-property
// checks and all).
import type { Dashboard } from '@grafana/schema';
import type { Options as BarGaugeOptions } from '@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen';
import type { Options as GeomapOptions } from '@grafana/schema/dist/esm/raw/composable/geomap/panelcfg/x/GeomapPanelCfg_types.gen';
import type { Options as StatOptions } from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type {
  FieldConfig as StateTimelineFieldConfig,
  Options as StateTimelineOptions,
} from '@grafana/schema/dist/esm/raw/composable/statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen';
import type { Options as TableOptions } from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen';
import type { Options as TextOptions } from '@grafana/schema/dist/esm/raw/composable/text/panelcfg/x/TextPanelCfg_types.gen';
import type {
  FieldConfig as TimeSeriesFieldConfig,
  Options as TimeSeriesOptions,
} from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';

export type Json<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends ReadonlyArray<infer U>
      ? Array<Json<U>>
      : T extends object
        ? { [K in keyof T]: Json<T[K]> }
        : T;

export type DashboardJson = Json<Dashboard>;

/** Panel plugin id -> the types of its `options` and `fieldConfig.defaults.custom`. */
export interface PanelTypes {
  bargauge: { options: Json<BarGaugeOptions>; custom: Record<string, unknown> };
  geomap: { options: Json<GeomapOptions>; custom: Record<string, unknown> };
  stat: { options: Json<StatOptions>; custom: Record<string, unknown> };
  'state-timeline': { options: Json<StateTimelineOptions>; custom: Json<StateTimelineFieldConfig> };
  table: { options: Json<TableOptions>; custom: Record<string, unknown> };
  text: { options: Json<TextOptions>; custom: Record<string, unknown> };
  timeseries: { options: Json<TimeSeriesOptions>; custom: Json<TimeSeriesFieldConfig> };
}
