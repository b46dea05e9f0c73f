// How the console writes numbers, sizes, shares, durations and instants: one place, so a page never
// prints a float's noise (0.13333333333333333), bytes under another unit's name, or a UTC instant
// where the viewer's own time is meant.

// Bytes in binary units (KiB = 1024 B), as memory is sized.
export function bytes(n) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let value = Number(n);
  let i = 0;
  while (Math.abs(value) >= 1024 && i < units.length - 1) { value /= 1024; i += 1; }
  return `${i ? value.toFixed(1) : value.toFixed(0)} ${units[i]}`;
}

// A plain number with at most `digits` decimals and the viewer's grouping (5,034,686; 0.1333).
export function number(n, digits = 4) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) return '–';
  return new Intl.NumberFormat(undefined, { maximumFractionDigits: digits }).format(Number(n));
}

// A fraction 0–1 as a percentage: 0.1 → "10 %", 0.12345 → "12.3 %".
export function percent(fraction, digits = 1) {
  if (fraction === null || fraction === undefined || Number.isNaN(Number(fraction))) return '–';
  return `${number(Number(fraction) * 100, digits)} %`;
}

// A temperature in degrees Celsius to a tenth (84.999 → "85.0 °C"): sensors are not finer than that.
export function celsius(degrees) {
  if (degrees === null || degrees === undefined || Number.isNaN(Number(degrees))) return '–';
  return `${Number(degrees).toFixed(1)} °C`;
}

// Seconds as the two largest units that matter: 42 s, 3 min 5 s, 2 h 10 min, 3 d 4 h.
export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(Number(seconds))) return '–';
  let s = Math.max(0, Math.round(Number(seconds)));
  const parts = [];
  for (const [unit, size] of [['d', 86400], ['h', 3600], ['min', 60], ['s', 1]]) {
    if (s >= size || (unit === 's' && !parts.length)) {
      parts.push(`${Math.floor(s / size)} ${unit}`);
      s %= size;
    }
    if (parts.length === 2) break;
  }
  return parts.join(' ');
}

// An RFC 3339 instant in the viewer's local time zone (the zone's name appended).
export function localTime(instant) {
  const d = new Date(instant);
  if (!instant || Number.isNaN(d.getTime())) return instant ? String(instant) : '–';
  // dateStyle/timeStyle cannot be combined with timeZoneName: the fields are named one by one
  return new Intl.DateTimeFormat(undefined, { weekday: 'short', year: 'numeric', month: 'short', day: 'numeric',
    hour: 'numeric', minute: '2-digit', timeZoneName: 'short' }).format(d);
}

// A metered quantity in the unit it counts: bytes in binary units, other units by name.
const UNIT_NAMES = { minute: ['minute', 'minutes'], day: ['day', 'days'], device_day: ['device-day', 'device-days'],
  token: ['token', 'tokens'], device_month: ['device-month', 'device-months'], month: ['month', 'months'],
  million_tokens: ['million tokens', 'million tokens'], GB: ['GB', 'GB'] };

export function quantity(value, unit) {
  if (unit === 'byte' || unit === 'bytes') return bytes(value);
  const names = UNIT_NAMES[unit];
  if (!names) return `${number(value)} ${unit || ''}`.trim();
  return `${number(value)} ${Number(value) === 1 ? names[0] : names[1]}`;
}
