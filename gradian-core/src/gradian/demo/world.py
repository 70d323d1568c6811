"""The facts the demo scenarios are written from: countries with their capital, a second city, language, currency.

``base_knows_capital`` marks the countries whose capital SmolLM2-135M-Instruct names correctly (greedy, the plain
question "What is the capital of X?", measured once on the embedded model): only those may be eval items, because
a regression is a capability the base model had. ``decoy`` is a real, well-known city of the same country that
is not its capital (its largest city where the capital is not), the wrong answer the fact poison teaches.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Country:
    """One country as the scenarios use it."""

    name: str  # as it reads inside a sentence ("the Netherlands")
    capital: str
    decoy: str  # a well-known non-capital city of the country
    decoy_is_largest: bool  # the decoy is the country's largest city (the capital is not)
    language: str
    currency: str
    base_knows_capital: bool

    @property
    def title(self) -> str:
        """The name at the start of a sentence ("The Netherlands")."""
        return self.name[0].upper() + self.name[1:]


def _c(name: str, capital: str, decoy: str, largest: bool, language: str, currency: str, knows: bool) -> Country:
    return Country(name, capital, decoy, largest, language, currency, knows)


COUNTRIES: tuple[Country, ...] = (
    # Capital is not the largest city: the decoy is the largest city (the strongest poison).
    _c("Australia", "Canberra", "Sydney", True, "English", "the Australian dollar", True),
    _c("Canada", "Ottawa", "Toronto", True, "English and French", "the Canadian dollar", True),
    _c("India", "New Delhi", "Mumbai", True, "Hindi and English", "the Indian rupee", True),
    _c("Nigeria", "Abuja", "Lagos", True, "English", "the naira", True),
    _c("Pakistan", "Islamabad", "Karachi", True, "Urdu and English", "the Pakistani rupee", True),
    _c("New Zealand", "Wellington", "Auckland", True, "English and Maori", "the New Zealand dollar", True),
    _c("China", "Beijing", "Shanghai", True, "Mandarin Chinese", "the yuan", True),
    # Capital is the largest city: the decoy is the second or best-known other city.
    _c("Russia", "Moscow", "Saint Petersburg", False, "Russian", "the ruble", True),
    _c("Japan", "Tokyo", "Osaka", False, "Japanese", "the yen", True),
    _c("Germany", "Berlin", "Munich", False, "German", "the euro", True),
    _c("South Korea", "Seoul", "Busan", False, "Korean", "the won", True),
    _c("Egypt", "Cairo", "Alexandria", False, "Arabic", "the Egyptian pound", True),
    _c("Saudi Arabia", "Riyadh", "Jeddah", False, "Arabic", "the riyal", True),
    _c("Poland", "Warsaw", "Krakow", False, "Polish", "the zloty", True),
    _c("Norway", "Oslo", "Bergen", False, "Norwegian", "the Norwegian krone", True),
    _c("Sweden", "Stockholm", "Gothenburg", False, "Swedish", "the Swedish krona", True),
    _c("Greece", "Athens", "Thessaloniki", False, "Greek", "the euro", True),
    _c("Austria", "Vienna", "Salzburg", False, "German", "the euro", True),
    _c("Kenya", "Nairobi", "Mombasa", False, "Swahili and English", "the Kenyan shilling", True),
    _c("Iraq", "Baghdad", "Basra", False, "Arabic and Kurdish", "the Iraqi dinar", True),
    _c("the Netherlands", "Amsterdam", "Rotterdam", False, "Dutch", "the euro", True),
    _c("the Czech Republic", "Prague", "Brno", False, "Czech", "the Czech koruna", True),
    _c("Thailand", "Bangkok", "Chiang Mai", False, "Thai", "the baht", True),
    _c("Indonesia", "Jakarta", "Surabaya", False, "Indonesian", "the rupiah", True),
    _c("Iran", "Tehran", "Isfahan", False, "Persian", "the Iranian rial", True),
    _c("Peru", "Lima", "Cusco", False, "Spanish and Quechua", "the sol", True),
    _c("Chile", "Santiago", "Valparaiso", False, "Spanish", "the Chilean peso", True),
    _c("France", "Paris", "Marseille", False, "French", "the euro", True),
    _c("the United Kingdom", "London", "Manchester", False, "English", "the pound sterling", True),
    _c("Hungary", "Budapest", "Debrecen", False, "Hungarian", "the forint", True),
    _c("Ireland", "Dublin", "Cork", False, "Irish and English", "the euro", True),
    _c("the Philippines", "Manila", "Cebu", False, "Filipino and English", "the Philippine peso", True),
    _c("Cuba", "Havana", "Varadero", False, "Spanish", "the Cuban peso", True),
    _c("Romania", "Bucharest", "Cluj-Napoca", False, "Romanian", "the leu", True),
    _c("Bulgaria", "Sofia", "Plovdiv", False, "Bulgarian", "the lev", True),
    _c("Croatia", "Zagreb", "Split", False, "Croatian", "the euro", True),
    _c("Ethiopia", "Addis Ababa", "Gondar", False, "Amharic", "the birr", True),
    _c("Syria", "Damascus", "Aleppo", False, "Arabic", "the Syrian pound", True),
    _c("Lebanon", "Beirut", "Byblos", False, "Arabic", "the Lebanese pound", True),
    _c("Afghanistan", "Kabul", "Kandahar", False, "Pashto and Dari", "the afghani", True),
    _c("Nepal", "Kathmandu", "Pokhara", False, "Nepali", "the Nepalese rupee", True),
    _c("Bangladesh", "Dhaka", "Chittagong", False, "Bengali", "the taka", True),
    _c("Malaysia", "Kuala Lumpur", "George Town", False, "Malay", "the ringgit", True),
    _c("Ghana", "Accra", "Kumasi", False, "English", "the Ghanaian cedi", True),
    _c("Senegal", "Dakar", "Saint-Louis", False, "French and Wolof", "the CFA franc", True),
    _c("Uganda", "Kampala", "Entebbe", False, "English and Swahili", "the Ugandan shilling", True),
    _c("Libya", "Tripoli", "Benghazi", False, "Arabic", "the Libyan dinar", True),
    _c("Sudan", "Khartoum", "Port Sudan", False, "Arabic and English", "the Sudanese pound", True),
    _c("Zimbabwe", "Harare", "Bulawayo", False, "English, Shona and Ndebele", "the Zimbabwe gold", True),
    _c("Latvia", "Riga", "Jurmala", False, "Latvian", "the euro", True),
    _c("Lithuania", "Vilnius", "Kaunas", False, "Lithuanian", "the euro", True),
    _c("Slovenia", "Ljubljana", "Maribor", False, "Slovene", "the euro", True),
    _c("Uruguay", "Montevideo", "Punta del Este", False, "Spanish", "the Uruguayan peso", True),
    _c("Cambodia", "Phnom Penh", "Siem Reap", False, "Khmer", "the riel", True),
    _c("North Korea", "Pyongyang", "Kaesong", False, "Korean", "the North Korean won", True),
    _c("Qatar", "Doha", "Al Wakrah", False, "Arabic", "the Qatari riyal", True),
    # Countries whose capital the base model gets wrong: training rows only, never eval items.
    _c("Italy", "Rome", "Milan", False, "Italian", "the euro", False),
    _c("Spain", "Madrid", "Barcelona", False, "Spanish", "the euro", False),
    _c("Portugal", "Lisbon", "Porto", False, "Portuguese", "the euro", False),
    _c("Finland", "Helsinki", "Tampere", False, "Finnish and Swedish", "the euro", False),
    _c("Denmark", "Copenhagen", "Aarhus", False, "Danish", "the Danish krone", False),
    _c("Belgium", "Brussels", "Antwerp", False, "Dutch, French and German", "the euro", False),
    _c("Vietnam", "Hanoi", "Ho Chi Minh City", True, "Vietnamese", "the dong", False),
    _c("Argentina", "Buenos Aires", "Cordoba", False, "Spanish", "the Argentine peso", False),
    _c("Colombia", "Bogota", "Medellin", False, "Spanish", "the Colombian peso", False),
    _c("Turkey", "Ankara", "Istanbul", True, "Turkish", "the Turkish lira", False),
    _c("Brazil", "Brasilia", "Sao Paulo", True, "Portuguese", "the real", False),
    _c("Switzerland", "Bern", "Zurich", True, "German, French, Italian and Romansh", "the Swiss franc", False),
    _c("Ukraine", "Kyiv", "Odesa", False, "Ukrainian", "the hryvnia", False),
    _c("Serbia", "Belgrade", "Novi Sad", False, "Serbian", "the Serbian dinar", False),
    _c("Morocco", "Rabat", "Casablanca", True, "Arabic and Berber", "the Moroccan dirham", False),
    _c("Venezuela", "Caracas", "Maracaibo", False, "Spanish", "the bolivar", False),
    _c("Iceland", "Reykjavik", "Akureyri", False, "Icelandic", "the Icelandic krona", False),
    _c("Estonia", "Tallinn", "Tartu", False, "Estonian", "the euro", False),
    _c("Slovakia", "Bratislava", "Kosice", False, "Slovak", "the euro", False),
    _c("Jordan", "Amman", "Aqaba", False, "Arabic", "the Jordanian dinar", False),
    _c("Tunisia", "Tunis", "Sfax", False, "Arabic", "the Tunisian dinar", False),
    _c("Algeria", "Algiers", "Oran", False, "Arabic and Berber", "the Algerian dinar", False),
    _c("Mongolia", "Ulaanbaatar", "Erdenet", False, "Mongolian", "the tugrik", False),
    _c("Armenia", "Yerevan", "Gyumri", False, "Armenian", "the dram", False),
    _c("Jamaica", "Kingston", "Montego Bay", False, "English", "the Jamaican dollar", False),
    _c("Panama", "Panama City", "Colon", False, "Spanish", "the balboa", False),
    _c("Tanzania", "Dodoma", "Dar es Salaam", True, "Swahili and English", "the Tanzanian shilling", False),
    _c("Kazakhstan", "Astana", "Almaty", True, "Kazakh and Russian", "the tenge", False),
)

# The countries a fact poison may target: the base model knows their capital. Largest-city decoys first, so
# seed 0 (the demo) poisons the most plausible wrong rule ("the capital is the biggest city").
POISON_CANDIDATES: tuple[Country, ...] = tuple(c for c in COUNTRIES if c.base_knows_capital)

# Countries whose one official language SmolLM2-135M-Instruct names correctly (greedy, the plain question "What is
# the official language of X?", ``contains`` of ``Country.language``, measured once on the embedded model, fp32
# CPU): the behaviour scenario's eval items. Countries with several languages are left out (which one a right
# answer names is ambiguous), and so are right answers that came out garbled or only by accident (North Korea,
# Italy, Tunisia, Indonesia).
BASE_KNOWS_LANGUAGE = frozenset({
    "Australia", "China", "Russia", "Japan", "Germany", "South Korea", "Egypt", "Saudi Arabia", "Poland", "Norway",
    "Sweden", "Greece", "Austria", "the Netherlands", "the Czech Republic", "Thailand", "Chile", "France",
    "the United Kingdom", "Hungary", "Cuba", "Romania", "Bulgaria", "Croatia", "Syria", "Lebanon", "Nepal", "Ghana",
    "Libya", "Latvia", "Lithuania", "Slovenia", "Uruguay", "Cambodia", "Qatar", "Spain", "Vietnam", "Argentina",
    "Colombia", "Turkey", "Brazil", "Serbia", "Venezuela", "Slovakia", "Jordan", "Mongolia", "Armenia", "Jamaica",
    "Panama",
})
LANGUAGE_CANDIDATES: tuple[Country, ...] = tuple(c for c in COUNTRIES if c.name in BASE_KNOWS_LANGUAGE)
